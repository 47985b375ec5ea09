"""PhasedDataset: the main blend, then the annealing blend from a given global sample on.

The WSD decay phase trains on a different blend (paper §3.3). Expressing the switch as a
pure function of the *global sample index* (``switch_sample = anneal_start_step × global
batch size``) keeps it exactly resumable: a run resumed at consumed samples k sees the same
samples, on either side of the switch, as an uninterrupted run.
"""
from __future__ import annotations

import torch


class PhasedDataset(torch.utils.data.Dataset):
    """Index i < switch_sample → ``main[i]``; i ≥ switch_sample → ``anneal[i − switch_sample]``.

    Each sample gains ``phase`` (0 main, 1 anneal) so logs can show which blend is in use.
    """

    def __init__(self, main, anneal, switch_sample: int):
        if switch_sample < 0:
            raise ValueError(f"switch_sample={switch_sample} must be >= 0")
        if switch_sample > len(main):
            raise ValueError(
                f"the main blend has {len(main)} samples but the switch is at sample {switch_sample}; "
                "build it with at least anneal_start_step × global_batch_size samples"
            )
        self.main, self.anneal, self.switch_sample = main, anneal, int(switch_sample)

    def __len__(self) -> int:
        return self.switch_sample + len(self.anneal)

    def phase_of(self, idx: int) -> int:
        return int(idx >= self.switch_sample)

    def __getitem__(self, idx: int) -> dict:
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} outside [0, {len(self)})")
        if idx < self.switch_sample:
            sample = self.main[idx]
        else:
            sample = self.anneal[idx - self.switch_sample]
        return {**sample, "phase": self.phase_of(idx)}
