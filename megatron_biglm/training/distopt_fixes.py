"""Optimizer-state fixes around checkpoint load (shared notes, "Distributed-optimizer
checkpoint bugs"), delegated to the named patches in `patches/` when they exist there.

before_load: a fresh optimizer has no Adam state, and the distributed optimizer's
  `state_dict()` (called while building the sharded state dict for loading) asserts on it
  (bug 2): give every parameter zero Adam state; the load overwrites it.
after_load: torch AdamW keeps a per-parameter `step`; it is not restored from the checkpoint
  (bug 4), and when it is, all parameters can share one tensor that is then incremented
  once per parameter (bug 5). Set every parameter's own `step` to the number of applied
  updates so bias correction continues exactly.
"""
from __future__ import annotations

import torch


def _inner_optimizers(optimizer):
    chained = getattr(optimizer, "chained_optimizers", None)
    for opt in (chained if chained is not None else [optimizer]):
        yield opt.optimizer


def before_load(optimizer) -> None:
    try:
        import patches
        fix = getattr(patches, "distopt_before_load", None)
    except ImportError:  # pragma: no cover
        fix = None
    if fix is not None:
        fix(optimizer)
        return
    for inner in _inner_optimizers(optimizer):
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                if not inner.state.get(p):
                    inner.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}
                    if group.get("amsgrad"):
                        inner.state[p]["max_exp_avg_sq"] = torch.zeros_like(p)


def after_load(optimizer, applied_steps: int) -> None:
    try:
        import patches
        fix = getattr(patches, "distopt_after_load", None)
    except ImportError:  # pragma: no cover
        fix = None
    if fix is not None:
        fix(optimizer, applied_steps)
        return
    for inner in _inner_optimizers(optimizer):
        for group in inner.param_groups:
            for p in group["params"]:
                st = inner.state.get(p)
                if st and "step" in st:
                    old = st["step"]
                    st["step"] = torch.tensor(float(applied_steps), dtype=old.dtype if torch.is_tensor(old)
                                              else torch.float32, device=old.device if torch.is_tensor(old) else "cpu")
