#!/usr/bin/env python
"""Tokenize jsonl / text / parquet corpora into Megatron indexed datasets.

The logic lives in `megatron_biglm.data.cli_preprocess`
(also `python -m megatron_biglm.data.cli_preprocess`); `--help` lists the options.
"""
import sys

from megatron_biglm.data.cli_preprocess import main

if __name__ == "__main__":
    sys.exit(main())
