"""Every random-number stream a training step can draw from, saved and restored as one.

Checkpoints store it per rank so a resumed run continues the same streams (dropout, and
anything else seeded from the global generators). `preserved_rng` runs side work
(validation, callbacks) without moving those streams: a DataLoader draws its base seed from
the global torch generator, so each validation pass would otherwise shift every later
dropout mask, and a run's training would depend on how often it validates.
"""
from __future__ import annotations

import contextlib
import random

import numpy as np
import torch
from megatron.core import tensor_parallel


def rng_state() -> dict:
    """python, numpy, torch (CPU and, with CUDA, GPU) and megatron's tracker states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
             "tracker": tensor_parallel.get_cuda_rng_tracker().get_states()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` returned (its "cuda" entry only where CUDA is available)."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def preserved_rng():
    """Run the body, then put every stream back where it was (also when the body raises)."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)
