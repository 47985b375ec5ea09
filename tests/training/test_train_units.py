"""Pieces of the driver with no model: FLOPs/MFU, NaN guard, graceful-stop signals, metrics."""
from __future__ import annotations

import json
import math
import os
import signal

import numpy as np
import pytest

from megatron_biglm.model.shape import BiGLMShape
from megatron_biglm.training.flops import (attended_pairs, expected_pair_fraction,
                                           forward_flops, mfu, train_step_flops)
from megatron_biglm.training.loop_state import LoopState, checkpoint_state, restore_state
from megatron_biglm.training.metrics import MetricsLogger, read_metrics
from megatron_biglm.training.nonfinite import NonFiniteGuard, TooManyNonFinite
from megatron_biglm.training.signals import GracefulStop


def _mask_pairs(L, s):
    """Count allowed (q, k) pairs of an explicit split mask: prefix rows see k < s."""
    q = np.arange(L)[:, None]
    k = np.arange(L)[None, :]
    return int(((q >= s) | (k < s)).sum())


def test_attended_pairs_equals_explicit_mask_count():
    rng = np.random.default_rng(0)
    for _ in range(50):
        L = int(rng.integers(4, 200))
        splits = rng.integers(1, L, size=3)
        assert attended_pairs(L, splits) == sum(_mask_pairs(L, s) for s in splits)
    assert attended_pairs(10, [0, 0]) == 200  # split 0 (mlm/no_attn): full attention


def test_expected_pair_fraction_by_monte_carlo():
    rng = np.random.default_rng(1)
    L = 2048
    s = rng.integers(int(0.2 * L), int(0.8 * L) + 1, size=200_000)
    empirical = np.mean((s ** 2 + (L - s) * L) / L ** 2)
    assert expected_pair_fraction(0.2) == pytest.approx(empirical, abs=2e-3)
    assert expected_pair_fraction(0.2) == pytest.approx(0.78, abs=1e-9)


def test_forward_flops_matches_matmul_count():
    shape = BiGLMShape(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                       head_dim=16, ffn_hidden_size=160, vocab_size=1000)
    T, pairs = 32, 600
    d = 16
    qkv = 2 * 64 * (4 * d + 2 * 2 * d)
    out = 2 * 4 * d * 64
    mlp = 2 * 64 * 320 + 2 * 160 * 64
    ref = 2 * (T * (qkv + out + mlp) + 4 * 4 * d * pairs) + 2 * 64 * 1000 * T
    assert forward_flops(shape, T, pairs) == ref
    full = train_step_flops(shape, 16, 2)
    split = train_step_flops(shape, 16, 2, splits=[4, 12])
    assert split < full and full == 3 * forward_flops(shape, 32, 2 * 256)
    plain = BiGLMShape(**{**shape.__dict__, "gated_mlp": False})  # fc1 without the gate: two matrices
    assert forward_flops(shape, T, pairs) - forward_flops(plain, T, pairs) == 2 * T * 2 * 64 * 160
    from megatron_biglm.model.config import BiGLMModelConfig
    from megatron_biglm.model.shape import shape_of

    cfg = BiGLMModelConfig.from_dict({"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                      "ffn_hidden_size": 160, "vocab_size": 1000, "seq_length": 32})
    assert shape_of(cfg).gated_mlp is cfg.gated_mlp is cfg.to_transformer_config().gated_linear_unit
    tf, u = mfu(2e12, 2.0, 4, 312.0)
    assert tf == pytest.approx(0.25) and u == pytest.approx(0.25 / 312)
    assert mfu(1e12, 1.0, 1, None)[1] is None


def test_nonfinite_guard_counts_and_stops():
    g = NonFiniteGuard(3)
    assert g.check(1.0, 1)
    assert not g.check(math.nan, 2) and not g.check(math.inf, 3)
    assert g.check(0.5, 4) and g.in_a_row == 0 and g.total_skipped == 2
    g.check(math.nan, 5)
    g.check(math.nan, 6)
    with pytest.raises(TooManyNonFinite, match="3 steps in a row.*5 skipped in total"):
        g.check(-math.inf, 7)


class _Curriculum:
    """A stateful piece with nothing to save until it has moved."""

    def __init__(self):
        self.position = 0

    def state_dict(self):
        return {"position": self.position} if self.position else {}

    def load_state_dict(self, state):
        self.position = state.get("position", 0)


def test_loop_state_and_guards_save_and_restore_themselves():
    guard, curriculum = NonFiniteGuard(5), _Curriculum()
    guard.check(math.nan, 3)
    state = LoopState(iteration=7, consumed_samples=56, consumed_tokens=3584, last_loss=1.5)
    saved = checkpoint_state(state, {"nonfinite": guard, "curriculum": curriculum})
    # the loop's fields at the top level (as checkpoints always had them); empty states left out
    assert saved == {"iteration": 7, "consumed_samples": 56, "consumed_tokens": 3584,
                     "nonfinite": {"in_a_row": 1, "total_skipped": 1}}
    curriculum.position = 4
    saved = json.loads(json.dumps(checkpoint_state(state, {"nonfinite": guard, "curriculum": curriculum})))
    fresh, fresh_guard, fresh_curriculum = LoopState(), NonFiniteGuard(5), _Curriculum()
    restore_state(saved, fresh, {"nonfinite": fresh_guard, "curriculum": fresh_curriculum})
    assert (fresh.iteration, fresh.consumed_samples, fresh.consumed_tokens) == (7, 56, 3584)
    assert fresh_guard.state_dict() == guard.state_dict() and fresh_curriculum.position == 4
    old = LoopState(tokens_per_sample=64)  # a checkpoint from before consumed_tokens was saved
    old.load_state_dict({"iteration": 2, "consumed_samples": 16})
    assert old.consumed_tokens == 16 * 64


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_graceful_stop_records_signal_and_restores(sig):
    before = signal.getsignal(sig)
    with GracefulStop() as stop:
        assert not stop.should_stop()
        os.kill(os.getpid(), sig)
        assert stop.should_stop() and stop.name == signal.Signals(sig).name
    assert signal.getsignal(sig) == before


def test_metrics_jsonl_and_tensorboard(tmp_path):
    m = MetricsLogger(tmp_path, enabled=True, total_steps=10, tensorboard=True, progress="plain")
    m.log({"step": 1, "loss": 2.5, "lr": 1e-3})
    m.log({"step": 2, "loss": float("nan"), "lr": 1e-3})
    m.close()
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and recs[0]["loss"] == 2.5 and recs[1]["loss"] == "nan"
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')
    with pytest.warns(UserWarning, match="skipped 1 unparseable"):
        assert len(read_metrics(tmp_path / "metrics.jsonl")) == 2


def test_a_run_whose_every_step_was_non_finite_stops_at_its_save_or_end():
    guard = NonFiniteGuard(max_in_a_row=5)
    assert not guard.check(float("nan"), 1) and not guard.check(float("inf"), 2)
    guard.settle()  # 2 in a row, below 5: the run goes on
    with pytest.raises(TooManyNonFinite, match=r"NaN/inf at every one of the run's 2 steps .*stopping without saving"):
        guard.settle(steps_run=2)
    guard.check(1.0, 3)  # one good step: the run changed weights, and may be saved
    guard.settle(steps_run=3)
