"""What the HF adapter's load-time probes decide, and that each decision is exact."""
from __future__ import annotations

import itertools
import random

import pytest
import torch
from eval_fixtures import one_torch_thread, tiny_bert, tiny_biglm  # noqa: F401

from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.model.attention_masks import (additive_mask, sequence_mask,
                                                  suffix_after_prefix_mask)
from megatron_biglm.inference import TokenIds
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule

VOCAB = 40
SPECIAL = TokenIds(bos_id=1, mask_id=3, pad_id=0, eos_id=2)


def tiny_roberta(seed=0):
    from transformers import RobertaConfig, RobertaForMaskedLM

    torch.manual_seed(seed)
    return RobertaForMaskedLM(RobertaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=130, pad_token_id=0,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)).eval()


def requests(seed=0):
    rng = random.Random(seed)
    out = []
    for _ in range(4):
        ctx = [rng.randrange(5, VOCAB) for _ in range(rng.randint(0, 12))]
        out += [ScoreRequest((SPECIAL.bos_id, *ctx),
                             tuple(rng.randrange(5, VOCAB) for _ in range(rng.randint(1, 4))))
                for _ in range(3)]
    return out


@pytest.mark.parametrize("make", [lambda: tiny_bert(VOCAB, seed=1), tiny_roberta,
                                  lambda: tiny_biglm(VOCAB, SPECIAL, seed=1)],
                         ids=["bert", "roberta", "biglm"])
def test_probes_enable_split_cache_and_head_only_when_exact(make):
    model = make().double()
    fast = HFMaskedLMAdapter(model, SPECIAL)
    info = fast.describe()
    assert info["split_mode"] == "4d-mask" and info["prefix_cache"]
    assert info["logits_at_positions_only"]
    plain = HFMaskedLMAdapter(model, SPECIAL, prefix_cache="off")
    plain._head = None  # full logits, full forward: the slow reference path
    rule = make_rule("beam", SPECIAL.mask_id, beam=2)
    a = score_requests(fast, requests(), rule, batch_size=5, prefix_reuse=True)
    b = score_requests(plain, requests(), rule, batch_size=5, prefix_reuse=False)
    assert [r.logprob for r in a] == pytest.approx([r.logprob for r in b], abs=1e-9)


def test_roberta_cache_uses_its_padding_offset_positions():
    adapter = HFMaskedLMAdapter(tiny_roberta().double(), SPECIAL)
    assert adapter.prefix_cache and adapter._position_offset == 1  # pad_token_id 0 + 1


class SplitKwargModel(torch.nn.Module):
    """A masked LM whose forward takes `split=` itself (builds its own split mask)."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config
        self.split_calls = 0

    def forward(self, input_ids=None, attention_mask=None, split=None):
        lengths = attention_mask.sum(-1)
        if split is not None:
            self.split_calls += 1
        mask = additive_mask(sequence_mask(lengths, input_ids.shape[1], split),
                             next(self.parameters()).dtype)
        return self.inner(input_ids=input_ids, attention_mask=mask)


def test_native_split_argument_is_used_when_the_model_has_one():
    inner = tiny_bert(VOCAB, seed=2).double()
    native = HFMaskedLMAdapter(SplitKwargModel(inner), SPECIAL)
    assert native.split_mode == "native" and not native.prefix_cache
    reference = HFMaskedLMAdapter(inner, SPECIAL)
    rule = make_rule("l2r", SPECIAL.mask_id)
    a = score_requests(native, requests(1), rule, batch_size=4)
    b = score_requests(reference, requests(1), rule, batch_size=4)
    assert native.model.split_calls > 0
    assert [r.logprob for r in a] == pytest.approx([r.logprob for r in b], abs=1e-10)


def test_masks_follow_the_split_rule_position_by_position():
    lengths, split = torch.tensor([6, 4, 5]), torch.tensor([3, 1, 5])
    full = sequence_mask(lengths, 6, split)
    for b, i, j in itertools.product(range(3), range(6), range(6)):
        want = j < lengths[b] and (j < split[b] or i >= split[b])
        assert bool(full[b, i, j]) == bool(want)
    # cached layout: queries = suffix rows, keys = [prefix padded to 4, suffix padded to 3]
    prefix_len, suffix_len = torch.tensor([2, 4]), torch.tensor([3, 1])
    cached = suffix_after_prefix_mask(prefix_len, 4, suffix_len, 3)
    for b, i, j in itertools.product(range(2), range(3), range(7)):
        real = j < prefix_len[b] if j < 4 else (j - 4) < suffix_len[b]
        assert bool(cached[b, i, j]) == bool(real)
    blocked = additive_mask(full, torch.float32)
    assert blocked.shape == (3, 1, 6, 6)
    assert set(blocked.unique().tolist()) == {0.0, torch.finfo(torch.float32).min}
