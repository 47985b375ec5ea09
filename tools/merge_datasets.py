"""Megatron-LM's `python tools/merge_datasets.py ...`, from a checkout without installing.

Runs `biglm-merge-datasets` (megatron_biglm/cli/merge_datasets.py, where the code lives):
`--input PREFIX... --output-prefix OUT`, or `--shards DIR` for a sharded preprocessing.
"""
import os, sys  # noqa: E401
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's package first
from megatron_biglm.cli.merge_datasets import main  # noqa: E402
if __name__ == "__main__":
    sys.exit(main())
