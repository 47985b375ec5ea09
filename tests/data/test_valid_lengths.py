"""Padding (`valid_lengths`) end to end through the pretraining recipe's forward: the collate
keeps it, the model's attention never reads padded keys (whatever tokens fill them), the
loss never counts padded positions, and a batch without padding runs exactly as before."""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.data.collate import collate_masked_lm
from megatron_biglm.training.pretrain_recipe import PretrainRecipe
from model_fixtures import build_model, init_megatron, tiny_config

SEQ = 32


@pytest.fixture(scope="module")
def model():
    # Tear down what this fixture created, so later tests (test_config's "no process group
    # exists yet") do not depend on the order the files run in.
    import torch.distributed as dist

    from megatron_biglm.common import process_groups

    created = not dist.is_initialized()
    init_megatron(1, 1)
    yield build_model(tiny_config(), seed=2)
    process_groups.destroy(created)


def _samples(valid, seed, pad_fill=0, restricted=True):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in valid:
        tokens = torch.randint(5, 200, (SEQ,), generator=g)
        tokens[n:] = pad_fill if isinstance(pad_fill, int) else torch.randint(5, 200, (SEQ - n,), generator=pad_fill)
        loss_mask = (torch.rand(SEQ, generator=g) < 0.4).float()
        loss_mask[SEQ - 1] = 1.0  # also a (padded, for n < SEQ) last position
        out.append({"tokens": tokens, "labels": torch.randint(5, 200, (SEQ,), generator=g),
                    "loss_mask": loss_mask, "split": torch.tensor(n // 2 if restricted else 0), "valid_lengths": n})
    return out


@pytest.mark.parametrize("restricted", [True, False], ids=["split", "full"])
@pytest.mark.parametrize("backend", ["sdpa", "local"])
def test_padding_is_neither_attended_nor_counted(model, restricted, backend):
    model.attention_backend = backend
    recipe = PretrainRecipe()
    valid = [SEQ, 20, 9]
    batch = collate_masked_lm(_samples(valid, seed=0, restricted=restricted))
    assert batch["valid_lengths"].tolist() == valid
    other = collate_masked_lm(_samples(valid, seed=0, pad_fill=torch.Generator().manual_seed(7),
                                       restricted=restricted))
    assert not torch.equal(batch["tokens"], other["tokens"])  # only the padding differs
    with torch.no_grad():
        out, loss_func = recipe.forward(model, batch, torch.device("cpu"))
        out_other, _ = recipe.forward(model, other, torch.device("cpu"))
    model.attention_backend = "sdpa"
    for b, n in enumerate(valid):
        assert torch.equal(out[b, :n], out_other[b, :n])  # padded keys are never read
        assert torch.all(out[b, n:] == 0)                  # padded positions are never predicted
    loss_sum, count, report = loss_func(out)
    expected = sum(int((batch["loss_mask"][b, :n] != 0).sum()) for b, n in enumerate(valid))
    assert int(count) == expected == recipe.loss_tokens(batch)
    assert report["lm loss"].tolist() == pytest.approx([float(out.sum()), expected])


def test_no_padding_key_means_full_length(model):
    """A batch without `valid_lengths` is today's pretraining batch: the same outputs as one
    whose valid lengths are all the full length."""
    recipe = PretrainRecipe()
    samples = _samples([SEQ, SEQ], seed=3)
    with_key = collate_masked_lm(samples)
    without = collate_masked_lm([{k: v for k, v in s.items() if k != "valid_lengths"} for s in samples])
    assert "valid_lengths" not in without
    with torch.no_grad():
        a, fa = recipe.forward(model, with_key, torch.device("cpu"))
        b, fb = recipe.forward(model, without, torch.device("cpu"))
    assert torch.equal(a, b)
    assert torch.equal(fa(a)[2]["lm loss"], fb(b)[2]["lm loss"])
