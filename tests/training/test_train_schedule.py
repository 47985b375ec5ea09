"""WSD and cosine lr curves from megatron-core's OptimizerParamScheduler, checked numerically."""
from __future__ import annotations

import math

import pytest

from megatron_biglm.config import load_config
from megatron_biglm.training.schedule import lr_curve


def _cfg(*over):
    """The (schedule, optimizer) sections lr_curve reads."""
    cfg = load_config(None, ["optimizer.lr=1e-3", "optimizer.min_lr=1e-4", *over])
    return cfg.schedule, cfg.optimizer


def test_wsd_linear_matches_formula():
    T, W, D = 100, 10, 20
    lrs = lr_curve(*_cfg(f"schedule.train_steps={T}", f"schedule.warmup_steps={W}", f"schedule.decay_steps={D}"))
    for i, lr in enumerate(lrs, start=1):
        if i <= W:
            ref = 1e-3 * i / W
        elif i <= T - D:
            ref = 1e-3
        else:
            ref = 1e-4 + (1e-3 - 1e-4) * (1 - (i - (T - D)) / D)
        assert lr == pytest.approx(ref, rel=1e-12, abs=1e-15), i
    assert lrs[-1] == pytest.approx(1e-4)  # the last step runs at min_lr


def test_wsd_paper_defaults_decay_fraction():
    # Table 7 scaled down 1000×: 300 steps, 60 annealing steps (20 %).
    lrs = lr_curve(*_cfg("schedule.train_steps=300", "schedule.warmup_steps=2"))
    assert all(lr == pytest.approx(1e-3) for lr in lrs[2:240])
    assert lrs[240] < 1e-3 and lrs[-1] == pytest.approx(1e-4)
    diffs = [a - b for a, b in zip(lrs[240:], lrs[241:])]
    assert max(diffs) == pytest.approx(min(diffs))  # linear decay


def test_cosine_matches_formula():
    T, W = 50, 5
    lrs = lr_curve(*_cfg("schedule.style=cosine", f"schedule.train_steps={T}", f"schedule.warmup_steps={W}"))
    for i, lr in enumerate(lrs, start=1):
        if i <= W:
            ref = 1e-3 * i / W
        else:
            ratio = (i - W) / (T - W)
            ref = 1e-4 + (1e-3 - 1e-4) * 0.5 * (1 + math.cos(math.pi * ratio))
        assert lr == pytest.approx(ref, rel=1e-12), i
