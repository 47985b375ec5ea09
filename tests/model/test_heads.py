"""Heads (model/heads.py) and pooling (model/pooling.py): the masked-LM head is the model's
output path, pooling respects padding, the registry refuses what it cannot build."""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.model.pooling import pool_hidden


def _reference_pool(hidden, lengths, mode):
    """Sample by sample, on the valid slice only: what pooling means, written plainly."""
    out = []
    for i, n in enumerate(lengths.tolist()):
        valid = hidden[i, :n].double()
        out.append({"mean": valid.mean(0), "first": valid[0], "last": valid[-1]}[mode])
    return torch.stack(out)


@pytest.mark.parametrize("mode", ["mean", "first", "last"])
def test_pooling_reads_only_the_valid_tokens(mode):
    g = torch.Generator().manual_seed(0)
    for trial in range(5):
        b, s, h = 4, 9, 6
        hidden = torch.randn(b, s, h, generator=g)
        lengths = torch.randint(1, s + 1, (b,), generator=g)
        lengths[0] = s  # one unpadded sample
        lengths[1] = 1  # one sample of a single token
        padded = hidden.clone()
        pad = torch.arange(s)[None, :] >= lengths[:, None]
        padded[pad] = float("inf")  # padding must not reach any pooled vector
        pooled = pool_hidden(padded, lengths, mode)
        assert pooled.shape == (b, h) and torch.isfinite(pooled).all()
        torch.testing.assert_close(pooled.double(), _reference_pool(hidden, lengths, mode),
                                   atol=1e-6, rtol=1e-6)


def test_pooling_without_lengths_is_over_the_whole_sequence_and_keeps_the_dtype():
    hidden = torch.randn(3, 5, 4).to(torch.bfloat16)
    mean = pool_hidden(hidden, None, "mean")
    assert mean.dtype == torch.bfloat16
    torch.testing.assert_close(mean.float(), hidden.float().mean(1), atol=1e-2, rtol=1e-2)
    assert torch.equal(pool_hidden(hidden, None, "last"), hidden[:, -1])
    assert torch.equal(pool_hidden(hidden, None, "first"), hidden[:, 0])


def test_pooling_rejects_bad_modes_shapes_and_lengths():
    hidden = torch.zeros(2, 4, 3)
    with pytest.raises(ValueError, match="mode"):
        pool_hidden(hidden, None, "max")
    with pytest.raises(ValueError, match="1..4"):
        pool_hidden(hidden, torch.tensor([0, 2]), "mean")
    with pytest.raises(ValueError, match="1..4"):
        pool_hidden(hidden, torch.tensor([5, 2]), "last")
    with pytest.raises(ValueError, match=r"\[batch\]"):
        pool_hidden(hidden, torch.tensor([1, 2, 3]), "mean")
    with pytest.raises(ValueError, match="batch, seq, hidden"):
        pool_hidden(hidden[0], None, "mean")


def test_registry_builds_known_heads_and_refuses_unknown_or_duplicate_names():
    from megatron_biglm.model.heads import (HEADS, HeadSpec, MaskedLMHead, PoolingHead, build_head,
                                            register_head)

    assert isinstance(build_head("masked_lm"), MaskedLMHead)
    assert build_head("pooling", mode="last").mode == "last"
    with pytest.raises(ValueError, match="unknown head 'no_such_head'"):
        build_head("no_such_head")
    with pytest.raises(ValueError, match="already registered"):
        register_head(HeadSpec("masked_lm", MaskedLMHead, owns_weights=False, doc=""))
    with pytest.raises(ValueError, match="pooling mode"):
        PoolingHead("max")
    from megatron_biglm.export.weight_table import head_rows, sidecar_file

    owning = {name for name, spec in HEADS.items() if spec.owns_weights}
    assert {"classification", "span", "length"} <= owning and not HEADS["masked_lm"].owns_weights
    assert head_rows("classification", {"num_labels": 3}) and head_rows("span", {})  # a task head's rows
    # the length head, which EuroBertForMaskedLM cannot hold, is exported to its own file
    assert sidecar_file("length_head.weight") is not None


# ---------------------------------------------------------------- heads on a real model
@pytest.fixture(scope="module")
def tiny():
    from model_fixtures import build_model, init_megatron, tiny_config

    init_megatron(1, 1)
    cfg = tiny_config()
    return cfg, build_model(cfg, seed=3)


def test_masked_lm_head_is_the_models_output_path(tiny):
    """The model's logits and loss are exactly the tied projection / sparse prediction of its
    final hidden states: the head adds nothing and drops nothing."""
    from model_fixtures import random_batch

    from megatron_biglm.model.loss import sparse_prediction_loss

    cfg, model = tiny
    batch = random_batch(cfg, 3, 40, seed=7)
    with torch.no_grad():
        hidden = model(batch["input_ids"], split=batch["split"], return_hidden=True)
        hidden = hidden.transpose(0, 1).contiguous()  # [s, b, h], as inside forward
        weight = model.shared_embedding_or_output_weight()
        expected_logits = model.output_layer(hidden, weight=weight)[0].transpose(0, 1)
        expected_loss = sparse_prediction_loss(hidden, batch["labels"], batch["loss_mask"],
                                               model.output_layer, weight)
        logits = model(batch["input_ids"], split=batch["split"])
        loss = model(batch["input_ids"], split=batch["split"], labels=batch["labels"],
                     loss_mask=batch["loss_mask"])
    assert torch.equal(logits, expected_logits)
    assert torch.equal(loss, expected_loss)
    assert not any(name.startswith("lm_head") for name in model.state_dict())  # no new weights
    with pytest.raises(ValueError, match="loss_mask"):
        model(batch["input_ids"], split=batch["split"], labels=batch["labels"])


def test_pooling_head_pools_the_models_hidden_states_over_valid_lengths(tiny):
    from megatron_biglm.model.heads import build_head

    cfg, model = tiny
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([12, 5])
    with torch.no_grad():
        hidden = model(ids, valid_lengths=lengths, return_hidden=True)  # [b, s, h]
        pooled = build_head("pooling", mode="mean")(
            model, hidden.transpose(0, 1), valid_lengths=lengths)
    torch.testing.assert_close(pooled[1], hidden[1, :5].mean(0), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(pooled[0], hidden[0].mean(0), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("head, options", [("classification", {"num_labels": 3, "pooling": "mean"}),
                                           ("span", {})])
def test_head_model_reads_host_lengths_as_each_row_alone(tiny, head, options):
    """A task-head model given the loader's CPU lengths: a batch whose rows are all full gives
    exactly the output of no lengths (full attention, the pooling over every position), and a
    batch with padded rows gives each row what it gives alone, unpadded."""
    from megatron_biglm.model.head_model import head_model_provider

    cfg, _ = tiny
    torch.manual_seed(5)
    model = head_model_provider(head, options)(True, True, cfg, cfg.to_transformer_config()).eval()
    g = torch.Generator().manual_seed(11)
    ids = torch.randint(4, cfg.vocab_size, (3, 20), generator=g)
    with torch.no_grad():
        full = model(ids, valid_lengths=torch.full((3,), 20))
        torch.testing.assert_close(full, model(ids), atol=0, rtol=0)
        lengths = torch.tensor([20, 13, 7])
        padded = ids.clone()
        padded[torch.arange(20)[None, :] >= lengths[:, None]] = 0
        out = model(padded, valid_lengths=lengths)
        for i, n in enumerate(lengths.tolist()):
            alone = model(ids[i:i + 1, :n])[0]
            if head == "span":
                torch.testing.assert_close(out[i, :n], alone, atol=1e-5, rtol=1e-5)
                assert torch.isneginf(out[i, n:]).all()
            else:
                torch.testing.assert_close(out[i], alone, atol=1e-5, rtol=1e-5)
