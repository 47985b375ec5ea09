#!/usr/bin/env python
"""Retrieval evaluation on BEIR-format folders: see megatron_biglm/finetune/retrieval/eval_cli.py.

    python tools/eval_retrieval.py --model DIR --data BEIR_DIR [BEIR_DIR ...] --output results.json [--split test]
"""
import sys

from megatron_biglm.finetune.retrieval.eval_cli import main

if __name__ == "__main__":
    sys.exit(main())
