#!/usr/bin/env python
"""Print a Megatron indexed dataset's statistics and decode documents.

The logic lives in `megatron_biglm.data.cli_inspect_dataset`
(also `python -m megatron_biglm.data.cli_inspect_dataset`); `--help` lists the options.
"""
import sys

from megatron_biglm.data.cli_inspect_dataset import main

if __name__ == "__main__":
    sys.exit(main())
