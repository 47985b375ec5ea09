"""Megatron-LM's `python tools/preprocess_data.py ...`, from a checkout without installing.

Runs `biglm-preprocess` (megatron_biglm/cli/preprocess.py, where the code lives) with the
same flags, Megatron's `--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR` included.
"""
import os, sys  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's package first
from megatron_biglm.cli.preprocess import main  # noqa: E402
if __name__ == "__main__":
    sys.exit(main())
