"""Checkpoint conversion from a checkout, as Megatron-LM users run its tools/ scripts:

    python tools/convert_checkpoint.py to-hf --checkpoint runs/x/checkpoints --output hf/x
    python tools/convert_checkpoint.py from-hf --hf hf/x --output ckpt/x --tp 2 --pp 1

Runs `biglm-export` (megatron_biglm/cli/convert.py, where the code lives) with the same arguments.
"""
import os, sys  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's package first
from megatron_biglm.cli.convert import main  # noqa: E402
if __name__ == "__main__":
    sys.exit(main())
