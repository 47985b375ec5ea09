"""Atomic checkpoint directories: seal/rename/latest, truncation and mismatch refusals."""
from __future__ import annotations

import pytest

from megatron_biglm.checkpoint.signature import check_compatible, model_signature
from megatron_biglm.checkpoint.dirs import (CheckpointError, complete_checkpoints,
                                                    latest_checkpoint, new_temp_dir,
                                                    resolve_load_path, seal, verify)


def _save(root, it, payload=b"x" * 100, keep_last=None):
    tmp = new_temp_dir(root, it)
    (tmp / "model").mkdir()
    (tmp / "model" / "shard.bin").write_bytes(payload)
    (tmp / "state.json").write_text('{"it": %d}' % it)
    return seal(tmp, it, keep_last=keep_last)


def test_seal_moves_latest_and_only_complete_are_listed(tmp_path):
    assert latest_checkpoint(tmp_path) is None
    first = _save(tmp_path, 10)
    assert latest_checkpoint(tmp_path) == first and first.name == "iter_0000010"
    # an interrupted save: a temp dir with data but no manifest is never picked
    crashed = new_temp_dir(tmp_path, 20)
    (crashed / "state.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == first
    second = _save(tmp_path, 30)
    assert latest_checkpoint(tmp_path) == second
    assert not crashed.exists(), "stale temp dirs are removed by the next save"
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["iter_0000010", "iter_0000030"]
    assert verify(second)["iteration"] == 30


def test_keep_last(tmp_path):
    for it in (1, 2, 3, 4):
        _save(tmp_path, it, keep_last=2)
    assert [p.name for p in complete_checkpoints(tmp_path)] == ["iter_0000003", "iter_0000004"]


def test_truncated_file_is_refused_with_file_named(tmp_path):
    ckpt = _save(tmp_path, 5)
    shard = ckpt / "model" / "shard.bin"
    shard.write_bytes(shard.read_bytes()[:37])
    with pytest.raises(CheckpointError, match=r"truncated: file model/shard.bin has 37 bytes, the manifest says 100"):
        latest_checkpoint(tmp_path)
    shard.unlink()
    with pytest.raises(CheckpointError, match="model/shard.bin is missing"):
        resolve_load_path(tmp_path, str(ckpt))
    (ckpt / "COMPLETE.json").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        resolve_load_path(tmp_path, "auto")


def test_resolve_load_modes(tmp_path):
    ckpt = _save(tmp_path, 7)
    assert resolve_load_path(tmp_path, "none") is None
    assert resolve_load_path(tmp_path, "auto") == ckpt
    assert resolve_load_path(tmp_path / "elsewhere", str(tmp_path)) == ckpt  # a root with 'latest'
    assert resolve_load_path(tmp_path / "elsewhere", str(ckpt)) == ckpt


def test_model_mismatch_names_each_difference():
    saved = model_signature({"num_layers": 2, "hidden_size": 64, "vocab_size": 8192, "lr": 1})
    current = model_signature({"num_layers": 2, "hidden_size": 96, "vocab_size": 50000})
    assert "lr" not in saved
    with pytest.raises(CheckpointError) as err:
        check_compatible(saved, current, "ck")
    msg = str(err.value)
    assert "model.hidden_size: checkpoint=64, this run=96" in msg
    assert "model.vocab_size: checkpoint=8192, this run=50000" in msg and "num_layers" not in msg
    check_compatible(saved, dict(saved), "ck")
