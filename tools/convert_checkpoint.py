"""Convert checkpoints between megatron-biglm (megatron-core dist checkpoints) and Hugging Face.

    python tools/convert_checkpoint.py to-hf   --checkpoint CKPT_DIR --output HF_DIR
    python tools/convert_checkpoint.py from-hf --hf HF_DIR --output CKPT_DIR --tp N --pp M

Exported directories are native transformers `EuroBertForMaskedLM` models (no remote code).
See `megatron_biglm/export/convert_cli.py` for every option.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from megatron_biglm.export.convert_cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
