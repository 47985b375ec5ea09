#!/usr/bin/env python
"""Train a byte-level BPE tokenizer on jsonl / text / parquet files.

The logic lives in `megatron_biglm.data.cli_train_tokenizer`
(also `python -m megatron_biglm.data.cli_train_tokenizer`); `--help` lists the options.
"""
import sys

from megatron_biglm.data.cli_train_tokenizer import main

if __name__ == "__main__":
    sys.exit(main())
