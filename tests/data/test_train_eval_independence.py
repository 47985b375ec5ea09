"""Validation settings must not change training: same seed, eval on or off, identical run.

Two ways validation used to leak into training, each checked here at its own depth:
- data: requesting validation/test samples changed the masking of every *training* sample
  (the masking stream was keyed on a description of all splits, and unrequested splits are
  dropped from it), so step-1 losses differed;
- RNG: each validation pass opened a DataLoader, which draws a seed from the global torch
  RNG, shifting every later dropout mask (and an lm-eval callback reseeds every generator).
"""
from __future__ import annotations

import random
import shutil

import numpy as np
import pytest
import torch

from megatron_biglm.cli.train import train
from train_fixtures import loss_and_grad_norm, tiny_overrides, train_data  # noqa: F401 (fixture)

KEYS = ("tokens", "labels", "loss_mask")


def _build(blend, tokenizer, **sizes):
    from megatron_biglm.data.pretrain_data import build_pretrain_datasets
    from megatron_biglm.common.process_groups import single_process_group
    from megatron_biglm.data.token_ids import TokenIds
    from megatron_biglm.data.tokenizer import load_tokenizer

    data = {"blend": blend, "split": "80,10,10", "seq_length": 64, "seed": 1234}
    token_ids = TokenIds.from_tokenizer(load_tokenizer(tokenizer))
    with single_process_group():
        return build_pretrain_datasets(data, token_ids=token_ids, **sizes)


def _second_corpus(train_data, tmp_path) -> str:
    """The same documents under another prefix: a second corpus for a weighted blend."""
    copy = tmp_path / "copy_text_document"
    for ext in (".bin", ".idx"):
        shutil.copyfile(train_data.prefix + ext, str(copy) + ext)
    return str(copy)


@pytest.mark.parametrize("blended", [False, True], ids=["one_corpus", "weighted_blend"])
def test_requested_valid_and_test_samples_leave_training_samples_unchanged(train_data, tmp_path, blended):
    blend = [[0.7, train_data.prefix], [0.3, _second_corpus(train_data, tmp_path)]] if blended \
        else [train_data.prefix]
    alone = _build(blend, train_data.tokenizer, train_samples=48).train
    for sizes in ({"valid_samples": 16}, {"test_samples": 8}, {"valid_samples": 24, "test_samples": 8}):
        other = _build(blend, train_data.tokenizer, train_samples=48, **sizes).train
        for i in range(48):
            a, b = alone[i], other[i]
            assert all(torch.equal(a[k], b[k]) for k in KEYS) and a["split"] == b["split"], (sizes, i)
    # ... while the splits themselves still mask independently of each other
    full = _build(blend, train_data.tokenizer, train_samples=48, valid_samples=48, test_samples=48)
    for held_out in (full.valid, full.test):
        assert sum(torch.equal(alone[i]["loss_mask"], held_out[i]["loss_mask"]) for i in range(48)) <= 2


def _reseed_like_lm_eval(step, loop_state):  # noqa: ARG001 - callback signature
    """A stand-in for the zero-shot hook: lm-eval's simple_evaluate reseeds every generator."""
    random.seed(0)
    np.random.seed(1234)
    torch.manual_seed(1234)


@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no_dropout", "dropout"])
def test_validating_does_not_change_the_training_trajectory(train_data, tmp_path, dropout):
    steps = 4
    model = {"model.hidden_dropout": dropout, "model.attention_dropout": dropout}
    quiet = tiny_overrides(train_data, tmp_path / "quiet", steps=steps, **model)
    validating = tiny_overrides(train_data, tmp_path / "validating", steps=steps, **model, **{
        "training.eval_interval": 1, "training.eval_iters": 2})
    train(None, quiet)
    res = train(None, validating, callbacks=[_reseed_like_lm_eval])
    assert res.first_val_loss is not None  # it did validate, before step 1 and after every step
    a, b = loss_and_grad_norm(tmp_path / "quiet"), loss_and_grad_norm(tmp_path / "validating")
    assert sorted(a) == list(range(1, steps + 1))
    assert a == b  # loss and grad norm at every step, bit for bit
