#!/usr/bin/env python
"""Concatenate Megatron indexed datasets into one.

The logic lives in `megatron_biglm.data.cli_merge_datasets`
(also `python -m megatron_biglm.data.cli_merge_datasets`); `--help` lists the options.
"""
import sys

from megatron_biglm.data.cli_merge_datasets import main

if __name__ == "__main__":
    sys.exit(main())
