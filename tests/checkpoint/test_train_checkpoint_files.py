"""The files every backend's checkpoint shares (checkpoint/files.py) and the RNG streams they
carry (rng.py), at world size 1: what is written is what a reader gets back, and restoring
the RNG continues the exact streams."""
from __future__ import annotations

import json
import random

import numpy as np
import torch

from megatron_biglm.checkpoint.dirs import latest_checkpoint, verify
from megatron_biglm.checkpoint.files import RunFiles, begin_checkpoint, restore_rng, seal_checkpoint
from megatron_biglm.config import load_config
from megatron_biglm.checkpoint.rng import preserved_rng


def _draws():
    return (random.random(), float(np.random.random()), torch.rand(3).tolist(), torch.randint(0, 10**6, (2,)).tolist())


def test_sealed_checkpoint_holds_state_signature_config_records_and_rng(tmp_path):
    config = load_config(None, ["data.seq_length=96", "checkpoint.keep_last=2"])
    files = RunFiles(config.to_yaml(), config.checkpoint.keep_last, {"record.json": '{"name": "é"}\n'})
    root = tmp_path / "ckpts"
    torch.manual_seed(3)
    for iteration in (2, 4, 6):
        tmp = begin_checkpoint(root, iteration, subdirs=("dist", "extra"))
        assert tmp.parent == root and tmp.name.startswith(f".tmp-iter_{iteration:07d}-")
        (tmp / "dist" / "shard.bin").write_bytes(bytes(range(iteration)))
        state = {"iteration": iteration, "consumed_samples": 8 * iteration, "world_size": 1}
        final = seal_checkpoint(tmp, iteration, state, {"hidden_size": 64}, files)
        expected_after = _draws()  # the streams right after the save
    assert final == latest_checkpoint(root) == root / "iter_0000006"
    assert sorted(p.name for p in root.iterdir()) == ["iter_0000004", "iter_0000006", "latest"]  # keep_last=2
    files = verify(final)["files"]
    assert set(files) == {"dist/shard.bin", "rng/rank_00000.pt", "train_state.json", "model_signature.json",
                          "config.yaml", "record.json"}
    assert (final / "record.json").read_text(encoding="utf-8") == '{"name": "é"}\n'
    assert (final / "dist" / "shard.bin").read_bytes() == bytes(range(6))
    assert json.loads((final / "train_state.json").read_text())["consumed_samples"] == 48
    assert json.loads((final / "model_signature.json").read_text()) == {"hidden_size": 64}
    assert load_config(final / "config.yaml", []).data.seq_length == 96
    assert (final / "config.yaml").read_text(encoding="utf-8") == config.to_yaml()

    _reseed(99)
    assert not restore_rng(final, saved_world_size=2)  # another layout: streams restart from the seed
    assert _draws() != expected_after
    assert restore_rng(final, saved_world_size=1)
    assert _draws() == expected_after


def _reseed(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def test_preserved_rng_leaves_every_stream_where_it_was():
    _reseed(5)
    untouched = _draws()
    for body_raises in (False, True):
        _reseed(5)
        try:
            with preserved_rng():
                _draws()
                list(torch.utils.data.DataLoader(range(4)))  # draws its base seed from torch's generator
                if body_raises:
                    raise RuntimeError("validation failed")
        except RuntimeError:
            assert body_raises
        assert _draws() == untouched


def test_a_record_named_like_a_file_the_checkpoint_writes_is_refused(tmp_path):
    import pytest

    root = tmp_path / "ckpts"
    tmp = begin_checkpoint(root, 1)
    with pytest.raises(ValueError, match=r"may not be named \['config.yaml'\]"):
        seal_checkpoint(tmp, 1, {"iteration": 1}, {}, RunFiles("run_dir: x\n", extra={"config.yaml": "other"}))
    assert latest_checkpoint(root) is None and not (tmp / "config.yaml").exists()
