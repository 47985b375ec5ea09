#!/usr/bin/env python
"""Plot training/validation loss of one or more runs against step and tokens (PNG).

The logic lives in `megatron_biglm.training.cli_plot_curves`
(also `python -m megatron_biglm.training.cli_plot_curves`); `--help` lists the options.
"""
import sys

from megatron_biglm.training.cli_plot_curves import main

if __name__ == "__main__":
    sys.exit(main())
