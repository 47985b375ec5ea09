#!/usr/bin/env python
"""Convert checkpoints between megatron-biglm (megatron-core dist checkpoints) and Hugging Face.

    python tools/convert_checkpoint.py to-hf   --checkpoint CKPT_DIR --output HF_DIR
    python tools/convert_checkpoint.py from-hf --hf HF_DIR --output CKPT_DIR --tp N --pp M

Exported directories are native transformers `EuroBertForMaskedLM` models (no remote code).
See `megatron_biglm/export/convert_cli.py` for every option.
"""
import sys

from megatron_biglm.export.convert_cli import main

if __name__ == "__main__":
    sys.exit(main())
