#!/usr/bin/env python
"""Print a BiGLM preset's parameter breakdown without allocating the model.

The logic lives in `megatron_biglm.model.cli_count_params`
(also `python -m megatron_biglm.model.cli_count_params`); `--help` lists the options.
"""
import sys

from megatron_biglm.model.cli_count_params import main

if __name__ == "__main__":
    sys.exit(main())
