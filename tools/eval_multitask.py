#!/usr/bin/env python
"""Table 5 row (MMLU ZS / FS, SuperGLUE AVG, Genset B-2 / D-2) for one model: see
megatron_biglm/finetune/multitask/cli.py.

    python tools/eval_multitask.py --model PATH --mmlu-shots 0 5 [--mmlu-data DIR] \
        --superglue-data SG_DIR --genset genset.jsonl --max-new-tokens 32 --output multitask.json
"""
import sys

from megatron_biglm.finetune.multitask.cli import main

if __name__ == "__main__":
    sys.exit(main())
