"""Scoring rules against brute force, on tiny masked LMs with fixed weights (float64).

Each rule's batched, padded, prefix-cached result must equal a reference computed with
explicit loops over slots and candidates, one unpadded forward at a time.
"""
from __future__ import annotations

import random

import pytest
from eval_fixtures import (bf_beam, bf_logprobs, bf_best_order, bf_confidence_greedy_decode, bf_greedy_reveal,
                           bf_l2r, bf_l2r_greedy_decode, bf_oneshot, bf_oneshot_decode, bf_pll,
                           one_torch_thread, tiny_bert, tiny_biglm)  # noqa: F401 - fixture

from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.inference import TokenIds
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule

VOCAB = 40
SPECIAL = TokenIds(bos_id=1, mask_id=3, pad_id=0, eos_id=2)
TOL = 1e-5


@pytest.fixture(scope="module", params=["bert", "biglm"])
def adapter(request):
    if request.param == "bert":
        model = tiny_bert(VOCAB, seed=3)
    else:
        model = tiny_biglm(VOCAB, SPECIAL, seed=3)
    adapter = HFMaskedLMAdapter(model.double(), SPECIAL)
    assert adapter.split_mode == "4d-mask" and adapter.prefix_cache, adapter.describe()
    return adapter


def random_requests(seed: int, groups: int = 5, choices: int = 3, max_cont: int = 4):
    """Groups of requests sharing a context (like one multiple-choice question)."""
    rng = random.Random(seed)
    out = []
    for _ in range(groups):
        ctx = [rng.randrange(5, VOCAB) for _ in range(rng.randint(0, 9))]
        for _ in range(choices):
            cont = [rng.randrange(5, VOCAB) for _ in range(rng.randint(1, max_cont))]
            out.append(ScoreRequest((SPECIAL.bos_id, *ctx), tuple(cont)))
    return out


BRUTE_FORCE = {"oneshot": bf_oneshot, "pll": bf_pll, "l2r": bf_l2r}


@pytest.mark.parametrize("prefix_reuse", [False, True])
@pytest.mark.parametrize("rule_name", ["oneshot", "pll", "l2r"])
def test_rule_equals_brute_force(adapter, rule_name, prefix_reuse):
    requests = random_requests(seed=11)
    got = score_requests(adapter, requests, make_rule(rule_name, SPECIAL.mask_id),
                         batch_size=4, prefix_reuse=prefix_reuse)
    for req, res in zip(requests, got):
        want, want_greedy = BRUTE_FORCE[rule_name](adapter.model, req.prefix, req.continuation,
                                                   SPECIAL.mask_id)
        assert res.logprob == pytest.approx(want, abs=TOL)
        assert res.is_greedy == want_greedy


@pytest.mark.parametrize("prefix_reuse", [False, True])
def test_beam_one_is_the_greedy_reveal_order(adapter, prefix_reuse):
    requests = random_requests(seed=12)
    got = score_requests(adapter, requests, make_rule("beam", SPECIAL.mask_id, beam=1),
                         batch_size=5, prefix_reuse=prefix_reuse)
    for req, res in zip(requests, got):
        want = bf_greedy_reveal(adapter.model, req.prefix, req.continuation, SPECIAL.mask_id)
        assert res.logprob == pytest.approx(want, abs=TOL)
        assert res.passes == len(req.continuation)


@pytest.mark.parametrize("beam", [2, 3])
def test_beam_equals_brute_force_beam(adapter, beam):
    requests = random_requests(seed=13, max_cont=5)
    got = score_requests(adapter, requests, make_rule("beam", SPECIAL.mask_id, beam=beam),
                         batch_size=7, prefix_reuse=True)
    for req, res in zip(requests, got):
        want = bf_beam(adapter.model, req.prefix, req.continuation, SPECIAL.mask_id, beam)
        assert res.logprob == pytest.approx(want, abs=TOL)
        n = len(req.continuation)
        assert res.passes <= make_rule("beam", SPECIAL.mask_id, beam=beam).max_passes(n) + n


def test_wide_beam_finds_the_best_reveal_order(adapter):
    """beam >= C(n, n/2) keeps every revealed set, so it is exact over all n! orders."""
    requests = [r for r in random_requests(seed=14, max_cont=4) if len(r.continuation) >= 3]
    assert requests
    got = score_requests(adapter, requests, make_rule("beam", SPECIAL.mask_id, beam=6),
                         batch_size=8, prefix_reuse=True)
    greedy = score_requests(adapter, requests, make_rule("beam", SPECIAL.mask_id, beam=1))
    for req, res, g in zip(requests, got, greedy):
        want = bf_best_order(adapter.model, req.prefix, req.continuation, SPECIAL.mask_id)
        assert res.logprob == pytest.approx(want, abs=TOL)
        assert res.logprob >= g.logprob - 1e-12  # a wider search never scores worse


DECODERS = {"oneshot": bf_oneshot_decode, "l2r": bf_l2r_greedy_decode,
            "beam": bf_confidence_greedy_decode}


@pytest.mark.parametrize("rule_name", ["oneshot", "l2r", "beam"])
def test_is_greedy_true_exactly_for_the_rules_own_argmax_fill(adapter, rule_name):
    rng = random.Random(15)
    requests, expected = [], []
    for _ in range(6):
        prefix = (SPECIAL.bos_id, *[rng.randrange(5, VOCAB) for _ in range(rng.randint(1, 6))])
        n = rng.randint(1, 4)
        decoded = DECODERS[rule_name](adapter.model, prefix, n, SPECIAL.mask_id)
        requests.append(ScoreRequest(prefix, tuple(decoded)))
        expected.append(True)
        wrong = list(decoded)
        wrong[rng.randrange(n)] = next(t for t in range(5, VOCAB) if t not in decoded)
        requests.append(ScoreRequest(prefix, tuple(wrong)))
        expected.append(False)
    for beam in ([1, 3] if rule_name == "beam" else [1]):
        got = score_requests(adapter, requests, make_rule(rule_name, SPECIAL.mask_id, beam=beam),
                             batch_size=4, prefix_reuse=True)
        assert [r.is_greedy for r in got] == expected


def test_pass_counts_are_the_documented_costs(adapter):
    requests = random_requests(seed=16, max_cont=5)
    n = [len(r.continuation) for r in requests]
    for name, want in (("oneshot", [1] * len(n)), ("pll", n), ("l2r", n), ("beam", n)):
        got = score_requests(adapter, requests, make_rule(name, SPECIAL.mask_id), batch_size=6)
        assert [r.passes for r in got] == want, name


def test_results_do_not_depend_on_batching_or_prefix_reuse(adapter):
    requests = random_requests(seed=17, groups=6)
    rule = make_rule("beam", SPECIAL.mask_id, beam=2)
    reference = score_requests(adapter, requests, rule, batch_size=1, prefix_reuse=False)
    for batch_size in (3, 64):
        for reuse in (False, True):
            got = score_requests(adapter, requests, rule, batch_size=batch_size, prefix_reuse=reuse)
            for a, b in zip(reference, got):
                assert b.logprob == pytest.approx(a.logprob, abs=1e-9)
                assert b.is_greedy == a.is_greedy


def test_empty_continuation_scores_zero_without_a_forward(adapter):
    req = ScoreRequest((SPECIAL.bos_id, 7, 8), ())
    for name in ("beam", "oneshot", "pll", "l2r"):
        (res,) = score_requests(adapter, [req], make_rule(name, SPECIAL.mask_id))
        assert (res.logprob, res.is_greedy, res.passes) == (0.0, True, 0)


def test_tail_tokens_are_present_but_unscored(adapter):
    """add_eos: an EOS after the slots changes the context of the slots, not what is summed."""
    base = ScoreRequest((SPECIAL.bos_id, 9, 10), (11, 12))
    tailed = ScoreRequest(base.prefix, base.continuation, (SPECIAL.eos_id,))
    rule = make_rule("oneshot", SPECIAL.mask_id)
    a, b = score_requests(adapter, [base, tailed], rule)
    seq = list(tailed.prefix) + [SPECIAL.mask_id] * 2 + [SPECIAL.eos_id]
    lp = bf_logprobs(adapter.model, seq, len(tailed.prefix))
    assert b.logprob == pytest.approx(lp[3, 11].item() + lp[4, 12].item(), abs=TOL)
    assert a.logprob != pytest.approx(b.logprob, abs=1e-6)


def test_too_long_request_is_refused_with_advice(adapter):
    req = ScoreRequest((SPECIAL.bos_id,) + (7,) * adapter.max_length, (8,))
    with pytest.raises(ValueError, match="truncate the context"):
        score_requests(adapter, [req], make_rule("oneshot", SPECIAL.mask_id))


def test_unknown_rule_and_bad_beam_are_refused():
    with pytest.raises(ValueError, match="choose one of beam, oneshot, pll, l2r"):
        make_rule("causal", SPECIAL.mask_id)
    with pytest.raises(ValueError, match="beam must be >= 1"):
        make_rule("beam", SPECIAL.mask_id, beam=0)
