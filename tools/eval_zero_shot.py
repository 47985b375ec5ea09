#!/usr/bin/env python
"""Zero-shot suite for masked LMs (lm-eval backend): see megatron_biglm/evaluation/cli.py.

    python tools/eval_zero_shot.py --model biglm|hf-mlm --model-args path=DIR,scoring=beam \
        --suite paper|TASK[,TASK] [--data-dir DIR] [--output results.json]
"""
import sys

from megatron_biglm.evaluation.cli import main

if __name__ == "__main__":
    sys.exit(main())
