"""The `elbo` scoring rule (stratified Monte-Carlo ELBO, LLaDA's estimator) on a tiny BiGLM in
float64: exact at n = 1, unbiased against exhaustive enumeration of the masked sets, the same
with and without the prefix cache, and independent of batching."""
from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest
from eval_fixtures import (bert_dir, bf_gold_logprobs, bf_oneshot, one_torch_thread,  # noqa: F401
                           tiny_biglm, wordpiece_dir)

from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule
from megatron_biglm.evaluation.scoring.elbo import stratified_mask_counts
from megatron_biglm.inference import TokenIds
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter

VOCAB = 40
SPECIAL = TokenIds(bos_id=1, mask_id=3, pad_id=0, eos_id=2)


@pytest.fixture(scope="module")
def adapter():
    adapter = HFMaskedLMAdapter(tiny_biglm(VOCAB, SPECIAL, seed=4).double(), SPECIAL)
    assert adapter.prefix_cache
    return adapter


def requests(seed: int, n: int | None = None, count: int = 4):
    rng = random.Random(seed)
    return [ScoreRequest((SPECIAL.bos_id, *[rng.randrange(5, VOCAB) for _ in range(rng.randint(0, 6))]),
                         tuple(rng.randrange(5, VOCAB) for _ in range(n or rng.randint(1, 4))))
            for _ in range(count)]


def exact_elbo(model, req) -> float:
    """(1/n) sum_k (n/k) mean_{|S|=k} sum_{j in S} log p(c_j | c outside S), by enumeration."""
    n = len(req.continuation)
    total = 0.0
    for k in range(1, n + 1):
        sets = list(itertools.combinations(range(n), k))
        per_set = [sum(bf_gold_logprobs(model, req.prefix, req.continuation,
                                        frozenset(range(n)) - set(s), SPECIAL.mask_id).values())
                   for s in sets]
        total += (n / k) * sum(per_set) / len(sets)
    return total / n


def test_stratified_counts_cover_every_k_evenly():
    rng = random.Random(0)
    assert sorted(stratified_mask_counts(4, 8, rng)) == [1, 1, 2, 2, 3, 3, 4, 4]
    assert all(1 <= k <= 5 for k in stratified_mask_counts(5, 3, rng))


def test_one_token_continuation_is_exact_in_one_pass(adapter):
    reqs = requests(1, n=1)
    got = score_requests(adapter, reqs, make_rule("elbo", SPECIAL.mask_id, samples=64), batch_size=3)
    for req, res in zip(reqs, got):
        want, _ = bf_oneshot(adapter.model, req.prefix, req.continuation, SPECIAL.mask_id)
        assert res.logprob == pytest.approx(want, abs=1e-9) and res.passes == 1


def test_unbiased_against_exhaustive_enumeration(adapter):
    reqs = requests(2, n=3, count=2)
    exact = [exact_elbo(adapter.model, r) for r in reqs]
    runs = [score_requests(adapter, reqs, make_rule("elbo", SPECIAL.mask_id, samples=2, seed=s),
                           batch_size=8, prefix_reuse=True) for s in range(120)]
    for i, want in enumerate(exact):
        values = [run[i].logprob for run in runs]
        mean, err = statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))
        assert err > 0 and abs(mean - want) < 4 * err + 1e-9, (mean, want, err)
        assert all(run[i].passes <= 2 for run in runs)


def test_cached_equals_uncached_and_batching_does_not_matter(adapter):
    reqs = requests(3, count=6)
    rule = make_rule("elbo", SPECIAL.mask_id, samples=8, seed=7)
    cached = score_requests(adapter, reqs, rule, batch_size=4, prefix_reuse=True)
    plain = score_requests(adapter, reqs, rule, batch_size=4, prefix_reuse=False)
    alone = [score_requests(adapter, [r], rule, batch_size=1)[0] for r in reqs[:2]]
    assert [r.logprob for r in cached] == pytest.approx([r.logprob for r in plain], abs=1e-9)
    assert [r.logprob for r in alone] == pytest.approx([r.logprob for r in plain[:2]], abs=1e-9)
    assert [r.is_greedy for r in cached] == [r.is_greedy for r in plain]


def test_bad_sample_count_is_refused():
    with pytest.raises(ValueError, match="positive integer"):
        make_rule("elbo", SPECIAL.mask_id, samples=0)


def test_elbo_through_the_lm_eval_model(bert_dir):
    from eval_fixtures import instances

    from megatron_biglm.evaluation.models import HFMaskedLMEvalLM

    lm = HFMaskedLMEvalLM(pretrained=str(bert_dir), scoring="elbo", elbo_samples=4, seed=1,
                          progress=False)
    pairs = [("the king", " is dead"), ("long", " live")]
    first = lm.loglikelihood(instances(pairs))
    assert first == lm.loglikelihood(instances(pairs))  # seeded: the same every call
    info = lm.get_model_info()["masked_lm_eval"]
    assert info["scoring"] == "elbo" and all(lp < 0 for lp, _ in first)
