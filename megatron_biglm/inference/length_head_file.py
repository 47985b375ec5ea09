"""The CMLM length head of an HF export, which `EuroBertForMaskedLM` cannot hold natively.

Export writes it beside the model as `length_head.safetensors` (tensors `length_head.weight`
[max + 1, h] and `length_head.bias`, the megatron names; `export.weight_table.SIDECAR_HEADS`).
Plain transformers ignores the file; `load_length_head(model_dir)` rebuilds the head so
`HFMaskedLMAdapter(..., length_head=...)` offers `predict_lengths` like the megatron adapter.
"""
from __future__ import annotations

from pathlib import Path

import torch

from megatron_biglm.model.heads import LengthHead

LENGTH_HEAD_FILE = "length_head.safetensors"


def load_length_head(model_dir, device: torch.device | str = "cpu") -> LengthHead | None:
    """The export's length head, or None when the export has none."""
    path = Path(model_dir) / LENGTH_HEAD_FILE
    if not path.is_file():
        return None
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    try:
        weight, bias = tensors["length_head.weight"], tensors["length_head.bias"]
    except KeyError as exc:
        raise ValueError(f"{path} lacks {exc}; re-export the checkpoint (it should hold "
                         "length_head.weight and length_head.bias)") from None
    head = LengthHead(weight.shape[1], weight.shape[0] - 1)
    head.load_state_dict({"weight": weight, "bias": bias})
    return head.to(device).eval()
