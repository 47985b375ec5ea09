"""Each private megatron-core member the project wraps (common/mcore_internals.py), pinned
against megatron-core's public behaviour on the installed release."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from megatron.core.datasets.gpt_dataset import GPTDataset

from dataset_fixtures import corpora, process_group  # noqa: F401  (fixtures)
from megatron_biglm.common.mcore_internals import UnsupportedMegatronCore, gpt_sample_tokens, mcore_version
from megatron_biglm.data.pretrain_data import build_pretrain_datasets


def test_query_document_sample_shuffle_indices_gives_the_public_sample_tokens(corpora, tmp_path, process_group):
    """GPTDataset._query_document_sample_shuffle_indices: its tokens are what the public
    GPTDataset.__getitem__ returns as `tokens` for the same sample (no extra token, full windows)."""
    prefix = next(iter(corpora.prefixes.values()))
    config = {"blend": [[1.0, prefix]], "split": "100,0,0", "seq_length": 96, "seed": 3,
              "cache_dir": str(tmp_path / "cache")}
    train = build_pretrain_datasets(config, token_ids=corpora.token_ids, train_samples=24,
                                    valid_samples=0, test_samples=0).train
    assert isinstance(train, GPTDataset)  # one corpus: megatron returns it unblended
    for idx in range(24):
        ours = gpt_sample_tokens(train, idx)
        public = GPTDataset.__getitem__(train, idx)["tokens"]
        assert ours.dtype == np.int64 and ours.shape == (96,)
        assert torch.equal(torch.from_numpy(ours), public), idx


class _Changed:
    """A dataset whose private lookup returns a shape no supported release returns."""

    def __init__(self, result):
        self.result = result

    def _query_document_sample_shuffle_indices(self, idx):
        return self.result


@pytest.mark.parametrize("result", [(np.arange(4), [0], [4], "new"), {"tokens": np.arange(4)},
                                    (np.arange(8).reshape(2, 4), [0])])
def test_an_unknown_return_shape_names_the_member_and_the_tested_releases(result):
    with pytest.raises(UnsupportedMegatronCore, match=r"_query_document_sample_shuffle_indices.*tested on 0\.16\.1"):
        gpt_sample_tokens(_Changed(result), 0)


def test_version_reads_the_installed_release():
    from importlib.metadata import version

    assert ".".join(map(str, mcore_version())) == ".".join(version("megatron-core").split(".")[:3])


def test_the_grad_norm_gradients_have_a_method_on_this_release_and_a_rename_is_named():
    """The device-side optimizer step takes the norm over the gradients megatron counts; the
    method was renamed between the tested releases, so the wrapper must find one of them on
    megatron's base optimizer here, and name the member when neither exists."""
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    from megatron_biglm.common.mcore_internals import grads_for_grad_norm

    assert any(hasattr(MegatronOptimizer, name)
               for name in ("get_grads_for_grad_norm", "get_main_grads_for_grad_norm"))

    class Renamed:
        def get_main_grads_for_grad_norm(self):
            return ["old"]

    assert grads_for_grad_norm(Renamed()) == ["old"]
    with pytest.raises(UnsupportedMegatronCore, match=r"get_grads_for_grad_norm.*tested on"):
        grads_for_grad_norm(object())


def _sharded(tensors: dict) -> dict:
    from megatron.core.dist_checkpointing import ShardedTensor

    return {key: ShardedTensor.from_rank_offsets(key, value, replica_id=0) for key, value in tensors.items()}


def test_the_in_process_save_strategy_writes_what_the_default_writes_without_forking(tmp_path, process_group):
    """`in_process_save_strategy` wraps the torch_dist writer's private per-save function: its
    checkpoint loads back (through the public `dist_checkpointing.load`) to the same tensors as
    one written by megatron's default strategy, and it starts no process, where the default
    forks a writer per file (0.16; 0.19's default writes from threads)."""
    import os

    from megatron.core import dist_checkpointing

    from megatron_biglm import patches
    from megatron_biglm.common.mcore_internals import in_process_save_strategy

    patches.apply_cpu()
    forks = []
    os.register_at_fork(before=lambda: forks.append(1))
    generator = torch.Generator().manual_seed(5)
    tensors = {f"layer{i}.weight": torch.randn(7 + i, 3, generator=generator) for i in range(5)}
    tensors["step"] = torch.tensor([11], dtype=torch.int64)
    loaded = {}
    for name, strategy in (("default", None), ("in_process", in_process_save_strategy())):
        folder = tmp_path / name
        folder.mkdir()
        before = len(forks)
        dist_checkpointing.save(_sharded(tensors), str(folder), sharded_strategy=strategy)
        loaded[name] = (dist_checkpointing.load(_sharded({k: torch.zeros_like(v) for k, v in tensors.items()}),
                                                str(folder)), len(forks) - before)
    assert loaded["in_process"][1] == 0
    # megatron's own writer forks a process per file up to 0.16; from 0.19 it runs threads
    assert (loaded["default"][1] > 0) == (mcore_version() < (0, 19))
    for name, (state, _) in loaded.items():
        for key, value in tensors.items():
            assert torch.equal(state[key], value), (name, key)


def test_an_mlp_subclass_builds_in_a_layer_on_this_release_with_the_layers_tp_group(caplog):
    import logging

    from megatron.core import parallel_state
    from model_fixtures import build_model, init_megatron, tiny_config

    from megatron_biglm.model.mlp import BiGLMMLP

    init_megatron()
    caplog.set_level(logging.WARNING)
    mlps = [m for m in build_model(tiny_config()).modules() if isinstance(m, BiGLMMLP)]
    assert mlps and all(m.tp_group is parallel_state.get_tensor_model_parallel_group() for m in mlps)
    assert "Rewrapping ModuleSpec" not in caplog.text and "Unknown MLP type" not in caplog.text
