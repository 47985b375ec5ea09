"""Shape bucketing of padded lengths: the bucketing function, and that
scoring and generation outputs do not change when widths are bucketed, while the widths that
reach the model are all buckets."""
from __future__ import annotations

import random

import pytest
from eval_fixtures import one_torch_thread, tiny_biglm  # noqa: F401
from generation_fakes import CharTokenizer, ScriptedAdapter

from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule
from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
from megatron_biglm.inference import TokenIds
from megatron_biglm.inference.buckets import LengthBuckets, parse_length_buckets, resolve_length_buckets
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter

SPECIAL = TokenIds(bos_id=1, mask_id=3, pad_id=0, eos_id=2)


def test_bucketing_function():
    b64 = LengthBuckets(multiple=64)
    assert [b64(n) for n in (1, 63, 64, 65, 200)] == [64, 64, 64, 128, 256]
    assert b64(65, cap=100) == 100 and b64(130, cap=100) == 130  # never below the real width
    pow2 = LengthBuckets(pow2=True)
    assert [pow2(n) for n in (1, 16, 17, 33, 64, 65)] == [16, 16, 32, 64, 64, 128]
    assert parse_length_buckets("off") is None and parse_length_buckets(None) is None
    assert parse_length_buckets("pow2") == pow2 and parse_length_buckets("64") == b64
    assert resolve_length_buckets("auto", "cpu") is None
    assert resolve_length_buckets("auto", "cuda:0") == b64
    with pytest.raises(ValueError, match="off, pow2 or a positive integer"):
        parse_length_buckets("big")
    with pytest.raises(ValueError, match="positive integer"):
        LengthBuckets(multiple=0)


def _record_widths(adapter, seen):
    for name in ("logits", "logits_with_prefix", "encode_prefix", "extend_prefix"):
        original = getattr(adapter, name)

        def wrapped(*args, _original=original, _name=name):
            ids = args[0] if _name in ("logits", "encode_prefix") else args[2]
            seen.append(ids.shape[1])
            return _original(*args)
        setattr(adapter, name, wrapped)


@pytest.mark.parametrize("prefix_reuse", [False, True])
def test_scoring_unchanged_by_bucketing(prefix_reuse):
    rng = random.Random(5)
    reqs = [ScoreRequest((1, *[rng.randrange(5, 40) for _ in range(rng.randint(0, 9))]),
                         tuple(rng.randrange(5, 40) for _ in range(rng.randint(1, 4))))
            for _ in range(8)]
    adapter = HFMaskedLMAdapter(tiny_biglm(40, SPECIAL, seed=2).double(), SPECIAL, max_length=40)
    rule = make_rule("beam", SPECIAL.mask_id)
    plain = score_requests(adapter, reqs, rule, batch_size=3, prefix_reuse=prefix_reuse)
    adapter.length_buckets, seen = LengthBuckets(multiple=16), []
    _record_widths(adapter, seen)
    bucketed = score_requests(adapter, reqs, rule, batch_size=3, prefix_reuse=prefix_reuse)
    assert [r.logprob for r in bucketed] == pytest.approx([r.logprob for r in plain], abs=1e-9)
    assert seen and all(w % 16 == 0 for w in seen)


# block-causal decoding (blocks="cached") needs the cache: it runs with use_cache only
@pytest.mark.parametrize("settings, use_cache", [
    (settings, use_cache) for use_cache in (True, False)
    for settings in (dict(length=7, steps=3), dict(length=9, steps=2, block_size=4, blocks="cached"),
                     dict(length=6, steps=3, block_size=4, blocks="refresh"))
    if use_cache or settings.get("blocks") != "cached"])
def test_generation_unchanged_by_bucketing(settings, use_cache):
    prompts = ["to be", "or not to be, that", "ay"]
    config = GenerationConfig(**settings)
    adapter, tok = ScriptedAdapter(vocab=44), CharTokenizer(44)
    want = MaskPredictGenerator(adapter, tok, use_cache=use_cache).generate(prompts, config)
    adapter.length_buckets, seen = LengthBuckets(pow2=True), []
    _record_widths(adapter, seen)
    got = MaskPredictGenerator(adapter, tok, use_cache=use_cache).generate(prompts, config)
    assert [o.ids for o in got] == [o.ids for o in want]
    assert [o.confidence for o in got] == [o.confidence for o in want]
    assert seen and all(w in (16, 32, 64) for w in seen)
