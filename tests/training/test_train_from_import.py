"""Training starts from an imported (weights-only) checkpoint: a tiny trained run is exported to
HF and imported back; a fine-tune from the import really starts from those weights (its step-0
validation loss equals the original model's on the same validation batch; a fresh init's
differs), at step 0 with a fresh schedule, and a preempted fine-tune resumes from its own
checkpoint bit-exactly, not from the import. Also: the start-point choice, the resume checks
that let weights-only checkpoints through, and the `num_query_groups` signature normalisation.
"""
from __future__ import annotations

import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from megatron_biglm.cli.train import TrainResult, train
from megatron_biglm.training.backends import Backend, check_resume
from megatron_biglm.checkpoint.signature import check_compatible, model_signature
from megatron_biglm.checkpoint.dirs import (CheckpointError, choose_start, new_temp_dir,
                                                    refuse_weights_only, seal)
from train_fixtures import loss_and_grad_norm, tiny_overrides, train_data, train_records  # noqa: F401

STEPS = 4
# Validation at step 0 (before any update) and at the end, on the same 8 validation batches
# (64 windows, not one noisy 8-window batch: a learning assertion below reads it).
EVAL = {"training.eval_interval": STEPS, "training.eval_iters": 8}


@dataclass
class Imported:
    original: TrainResult   # the trained run that was exported
    hf_dir: Path
    checkpoint_root: Path   # from_hf output at TP=1


@pytest.fixture(scope="module")
def imported(train_data, tmp_path_factory) -> Imported:  # noqa: F811 - fixture
    from megatron_biglm.export.convert_from_hf import from_hf
    from megatron_biglm.export.convert_to_hf import to_hf

    tmp = tmp_path_factory.mktemp("from_import")
    original = train(None, tiny_overrides(train_data, tmp / "original", steps=STEPS, **EVAL))
    to_hf(tmp / "original" / "checkpoints", tmp / "hf", progress=False)
    from_hf(tmp / "hf", tmp / "imported", tp=1, progress=False)
    return Imported(original, tmp / "hf", tmp / "imported")


def test_fine_tune_starts_from_imported_weights_and_resumes_its_own_checkpoint(
        imported, train_data, tmp_path, capsys):  # noqa: F811 - fixture
    load = {"checkpoint.load": str(imported.checkpoint_root)}
    straight = train(None, tiny_overrides(train_data, tmp_path / "straight", steps=STEPS, **EVAL, **load))
    out = capsys.readouterr().out
    assert "starting at step 0 from the weights of" in out and "fresh optimizer and LR schedule" in out
    assert straight.initialized_from == str(imported.checkpoint_root / "iter_0000000")
    assert straight.resumed_from is None and straight.iteration == STEPS

    # Weights really loaded: before any update, the validation loss is the exported model's on
    # the same batch; the fresh init of the original run (same seed) scored differently.
    assert straight.first_val_loss == imported.original.last_val_loss  # fp32 round trip: exact
    # The original's 4 steps moved the validation loss by 0.347-0.377 over seeds (training.seed =
    # data.seed) 1..5 and 1234; bar = 1/3 of the minimum (and the same bar for the first batch's
    # training loss, which those 4 steps trained on).
    assert abs(imported.original.first_val_loss - imported.original.last_val_loss) > 0.1
    ours, fresh = train_records(tmp_path / "straight"), train_records(imported.original.run_dir)
    assert abs(ours[1]["loss"] - fresh[1]["loss"]) > 0.1  # same first batch, other weights
    # Step 0, fresh schedule: the same steps, samples and warmup lr as a run from scratch.
    assert sorted(ours) == list(range(1, STEPS + 1)) and ours[1]["consumed_samples"] == 8
    assert [ours[s]["lr"] for s in ours] == [fresh[s]["lr"] for s in fresh]

    # A preempted fine-tune: the same command resumes from the run's own checkpoint.
    split = tmp_path / "split"
    first = train(None, tiny_overrides(train_data, split, steps=STEPS, **EVAL, **load,
                                       **{"training.exit_after_steps": 2}))
    assert first.iteration == 2 and first.initialized_from is not None
    saved = json.loads((split / "checkpoints" / "iter_0000002" / "train_state.json").read_text())
    assert saved["iteration"] == 2 and not saved.get("weights_only", False)
    capsys.readouterr()
    second = train(None, tiny_overrides(train_data, split, steps=STEPS, **EVAL, **load))
    assert "already saved" in capsys.readouterr().out
    assert second.resumed_from == str(split / "checkpoints" / "iter_0000002")
    assert second.initialized_from is None and second.iteration == STEPS
    assert loss_and_grad_norm(split) == loss_and_grad_norm(tmp_path / "straight")  # bit for bit
    assert second.last_val_loss == straight.last_val_loss


@pytest.mark.slow
def test_import_at_tp2_trains_at_tp1(imported, train_data, tmp_path):  # noqa: F811 - fixture
    """from_hf at TP=2 (torchrun ranks) resharded on load into a TP=1 run: same weights."""
    from megatron_biglm.export.convert_from_hf import from_hf

    from_hf(imported.hf_dir, tmp_path / "tp2", tp=2, progress=False)
    assert json.loads((tmp_path / "tp2" / "iter_0000000" / "train_state.json").read_text())["tp"] == 2
    res = train(None, tiny_overrides(train_data, tmp_path / "run", steps=3, **EVAL,
                                     **{"checkpoint.load": str(tmp_path / "tp2")}))
    assert res.first_val_loss == imported.original.last_val_loss


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed not installed")
def test_deepspeed_fine_tune_starts_from_imported_weights(imported, train_data, tmp_path):  # noqa: F811
    """The weights go into the module before deepspeed.initialize (ZeRO's fp32 master copy)."""
    res = train(None, tiny_overrides(train_data, tmp_path / "ds", steps=3, **EVAL, **{
        "training.backend": "deepspeed", "training.deepspeed.zero_stage": 2,
        "checkpoint.load": str(imported.checkpoint_root)}))
    assert res.initialized_from is not None and res.resumed_from is None
    assert res.first_val_loss == pytest.approx(imported.original.last_val_loss, abs=1e-6)
    # the update used the loaded weights too: a megatron fine-tune takes the same steps
    ref = train(None, tiny_overrides(train_data, tmp_path / "mg", steps=3, **EVAL,
                                     **{"checkpoint.load": str(imported.checkpoint_root)}))
    got, want = loss_and_grad_norm(tmp_path / "ds"), loss_and_grad_norm(tmp_path / "mg")
    for step in (1, 2, 3):
        assert got[step][0] == pytest.approx(want[step][0], abs=2e-5)
    assert res.last_val_loss == pytest.approx(ref.last_val_loss, abs=2e-5)


# ---------------------------------------------------------------- units (no training)
def _fake_checkpoint(root: Path, iteration: int, weights_only: bool) -> Path:
    tmp = new_temp_dir(root, iteration)
    (tmp / "train_state.json").write_text(json.dumps({"iteration": iteration, "weights_only": weights_only}))
    return seal(tmp, iteration)


def test_choose_start_prefers_the_runs_own_checkpoint_over_an_import(tmp_path):
    imported = _fake_checkpoint(tmp_path / "imported", 0, weights_only=True)
    own_root = tmp_path / "run" / "checkpoints"
    start = choose_start(own_root, str(tmp_path / "imported"))
    assert (start.path, start.weights_only, start.note) == (imported, True, None)
    assert choose_start(own_root, "auto").path is None and choose_start(own_root, "none").path is None
    own = _fake_checkpoint(own_root, 2, weights_only=False)
    start = choose_start(own_root, str(tmp_path / "imported"))
    assert (start.path, start.weights_only) == (own, False) and str(imported.parent) in start.note
    # an explicit full checkpoint stays what was asked for
    other = _fake_checkpoint(tmp_path / "other", 5, weights_only=False)
    assert choose_start(own_root, str(other)).path == other
    # the import's own root as the run's checkpoint dir: auto finds the weights-only start
    start = choose_start(tmp_path / "imported", "auto")
    assert (start.path, start.weights_only) == (imported, True)


def test_weights_only_passes_resume_checks_that_full_checkpoints_fail(tmp_path):
    ds = Backend("deepspeed", *[None] * 5, reshardable=False, shutdown=None)
    mg = Backend("megatron", *[None] * 5, reshardable=True, shutdown=None)
    imported = {"weights_only": True, "dp": 1, "tp": 2, "pp": 2}  # no backend field: a from_hf import
    for backend in (ds, mg):
        for dp in (1, 2, 3, 8):
            check_resume(imported, backend, tmp_path, dp)
    with pytest.raises(CheckpointError, match="written by the megatron backend"):
        check_resume({"backend": "megatron", "dp": 1}, ds, tmp_path, 1)
    with pytest.raises(CheckpointError, match="data-parallel size 1, this run has 2"):
        check_resume({"backend": "deepspeed", "dp": 1}, ds, tmp_path, 2)
    with pytest.raises(CheckpointError, match="holds model weights only"):
        refuse_weights_only(tmp_path, imported)
    refuse_weights_only(tmp_path, {"iteration": 3})


def test_null_query_groups_equals_the_head_count():
    from megatron_biglm.model import load_preset

    rng = random.Random(0)
    for _ in range(200):
        heads = rng.choice([1, 2, 3, 4, 6, 8, 12, 16])
        groups = rng.choice([g for g in range(1, heads + 1) if heads % g == 0])
        base = {"num_layers": 2, "num_attention_heads": heads, "hidden_size": 16 * heads}
        null, explicit = dict(base, num_query_groups=None), dict(base, num_query_groups=groups)
        if groups == heads:
            check_compatible(null, explicit, "ckpt")
            check_compatible(explicit, null, "ckpt")
            assert model_signature(null) == model_signature(explicit)
        else:
            with pytest.raises(CheckpointError, match=rf"num_query_groups: checkpoint={heads}, this run={groups}"):
                check_compatible(null, explicit, "ckpt")
            assert model_signature(null) != model_signature(explicit)
    # from real model configs (what the trainer and the importer compare)
    mha = {"num_attention_heads": 4, "hidden_size": 64, "num_layers": 2, "ffn_hidden_size": 192}
    a = load_preset("tiny", dict(mha, num_query_groups=None))
    b = load_preset("tiny", dict(mha, num_query_groups=4))
    sig = [model_signature({**m.to_dict(), "padded_vocab_size": m.padded_vocab_size}) for m in (a, b)]
    assert sig[0] == sig[1] and sig[0]["num_query_groups"] == 4
