#!/usr/bin/env python
"""Mask-Predict generation from an HF export or a megatron checkpoint: see
megatron_biglm/generation/cli.py.

    python tools/generate.py --model PATH --prompt TEXT --length 16 [--steps 10] [--show-steps]
    python tools/generate.py --model PATH --input prompts.jsonl --output out.jsonl --max-new-tokens 32
"""
import sys

from megatron_biglm.generation.cli import main

if __name__ == "__main__":
    sys.exit(main())
