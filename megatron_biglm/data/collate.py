"""collate_masked_lm: stack masked-LM samples into the batch the training step consumes."""
from __future__ import annotations

from typing import Sequence

import torch

REQUIRED_KEYS = ("tokens", "labels", "loss_mask", "split")
OPTIONAL_INT_KEYS = ("dataset_id", "phase", "valid_lengths")


def collate_masked_lm(samples: Sequence[dict], with_position_ids: bool = True) -> dict[str, torch.Tensor]:
    """Batch samples: ``tokens``/``labels`` int64 [b,s], ``loss_mask`` float32 [b,s],
    ``split`` int64 [b], ``position_ids`` int64 [b,s] (0..s−1, for RoPE) unless disabled, and
    ``dataset_id`` int64 [b] when the samples come from a blend (which corpus each came from)
    and ``phase`` int64 [b] (0 main, 1 anneal) when they come from a PhasedDataset, and
    ``valid_lengths`` int64 [b] when the samples are right-padded (the real tokens of each;
    absent means no padding: every position is real).
    """
    if not samples:
        raise ValueError("collate_masked_lm got an empty list of samples")
    missing = [k for k in REQUIRED_KEYS if k not in samples[0]]
    if missing:
        raise KeyError(f"samples lack {missing}; expected MaskedLMDataset samples with keys {REQUIRED_KEYS}")
    lengths = {int(s["tokens"].shape[0]) for s in samples}
    if len(lengths) != 1:
        raise ValueError(f"samples have different lengths {sorted(lengths)}; all windows must be seq_length")
    batch = {
        "tokens": torch.stack([s["tokens"] for s in samples]).long(),
        "labels": torch.stack([s["labels"] for s in samples]).long(),
        "loss_mask": torch.stack([s["loss_mask"] for s in samples]).float(),
        "split": torch.stack([torch.as_tensor(s["split"]) for s in samples]).long(),
    }
    if with_position_ids:
        b, s = batch["tokens"].shape
        batch["position_ids"] = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    for key in OPTIONAL_INT_KEYS:
        if key in samples[0]:
            batch[key] = torch.tensor([int(s[key]) for s in samples], dtype=torch.int64)
    return batch
