"""apply_objective: the drawn laws, span/token selection, special tokens and labels.

Statistical checks use many draws with fixed seeds; thresholds are loose enough to hold for
any seed (p-values > 1e-3, bounds several standard errors wide) yet fail on a wrong law.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from megatron_biglm.model.attention_masks import dense_split_mask
from megatron_biglm.objective import (
    IGNORE_INDEX,
    ObjectiveConfig,
    apply_objective,
    select_spans,
    select_tokens,
)
from megatron_biglm.objective.apply import _random_replacements

MASK, EOS, BOS, PAD = 3, 1, 0, 2
SPECIALS = (BOS, EOS, PAD, MASK)
VOCAB = 5000


def text_like(rng, n, special_rate=0.0):
    """Token ids >= 4 with an optional share of EOS/BOS/PAD sprinkled in."""
    toks = rng.integers(4, VOCAB, size=n)
    if special_rate:
        where = rng.random(n) < special_rate
        toks[where] = rng.choice([BOS, EOS, PAD], size=int(where.sum()))
    return toks


def draws(config, n, seq_len, seed=0, special_rate=0.0):
    rng = np.random.default_rng(seed)
    for i in range(n):
        toks = text_like(rng, seq_len, special_rate)
        yield toks, apply_objective(toks, config, np.random.default_rng([seed, i]), MASK, SPECIALS)


def realised_ratios(toks, out):
    eligible = ~np.isin(toks, SPECIALS)
    cut = out["prefix_len"]
    masked = out["loss_mask"].astype(bool)
    bx = masked[:cut].sum() / max(1, eligible[:cut].sum())
    by = masked[cut:].sum() / max(1, eligible[cut:].sum())
    return bx, by, eligible[:cut].sum(), eligible[cut:].sum()


@pytest.mark.parametrize("alpha,seq_len", [(0.2, 50), (0.1, 37), (0.4, 64)])
def test_split_is_uniform_over_alpha_range(alpha, seq_len):
    lo, hi = math.ceil(alpha * seq_len - 1e-9), math.floor((1 - alpha) * seq_len + 1e-9)
    cfg = ObjectiveConfig(alpha=alpha, suffix_unit="token")
    splits = np.array([o["split"] for _, o in draws(cfg, 6000, seq_len, seed=int(alpha * 100))])
    assert splits.min() == lo and splits.max() == hi
    counts = np.bincount(splits - lo, minlength=hi - lo + 1)
    assert len(counts) == hi - lo + 1
    assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("unit", ["token", "span"])
@pytest.mark.parametrize("beta_y_range", [(0.0, 1.0), (0.2, 0.8)])
def test_suffix_ratio_follows_uniform_law(unit, beta_y_range):
    cfg = ObjectiveConfig(suffix_unit=unit, beta_y_range=beta_y_range)
    by = np.array([realised_ratios(t, o)[1] for t, o in draws(cfg, 2500, 512, seed=1)])
    lo, hi = beta_y_range
    assert stats.kstest(by, stats.uniform(lo, hi - lo).cdf).pvalue > 1e-3
    assert abs(by.mean() - (lo + hi) / 2) < 0.02


def test_adaptive_prefix_ratio_is_tied_to_suffix_ratio():
    cfg = ObjectiveConfig(lambda1=0.5, lambda2=0.4, suffix_unit="token")
    rows = [(realised_ratios(t, o), o["beta_y"]) for t, o in draws(cfg, 1500, 512, seed=2)]
    bx = np.array([r[0][0] for r in rows])
    by = np.array([r[0][1] for r in rows])
    n_prefix = np.array([r[0][2] for r in rows])
    drawn_by = np.array([r[1] for r in rows])
    # per sample: realised β_X is λ1 − λ2·β_Y up to the one-token stochastic rounding
    assert np.all(np.abs(bx - (0.5 - 0.4 * drawn_by)) <= 1.0 / n_prefix + 1e-12)
    slope, intercept, r, *_ = stats.linregress(by, bx)
    assert r < -0.95
    assert abs(slope + 0.4) < 0.03 and abs(intercept - 0.5) < 0.02


def test_uniform_prefix_ratio_is_uniform_and_independent():
    cfg = ObjectiveConfig(prefix_mode="uniform", beta_x_range=(0.1, 0.3), suffix_unit="token")
    ratios = np.array([realised_ratios(t, o)[:2] for t, o in draws(cfg, 2500, 512, seed=3)])
    bx, by = ratios[:, 0], ratios[:, 1]
    assert stats.kstest(bx, stats.uniform(0.1, 0.2).cdf).pvalue > 1e-3
    assert abs(stats.pearsonr(bx, by).statistic) < 0.08


def test_default_adaptive_law_of_the_reference():
    cfg = ObjectiveConfig()  # β_X = 0.3 − 0.2 β_Y, β_Y ~ U(0,1): β_X ~ U(0.1, 0.3)
    bx = np.array([o["beta_x"] for _, o in draws(cfg, 2000, 256, seed=4)])
    assert bx.min() >= 0.1 and bx.max() <= 0.3
    assert stats.kstest(bx, stats.uniform(0.1, 0.2).cdf).pvalue > 1e-3


@pytest.mark.parametrize("max_ngram,law", [(3, "uniform"), (5, "harmonic"), (1, "uniform")])
def test_spans_are_disjoint_bounded_and_hit_the_count(max_ngram, law):
    rng = np.random.default_rng(max_ngram)
    full_lengths = []
    for _ in range(800):
        m = int(rng.integers(1, 300))
        eligible = rng.random(m) > 0.1
        ratio = rng.random()
        mask, starts, lengths = select_spans(eligible, ratio, max_ngram, rng, law)
        assert np.all((lengths >= 1) & (lengths <= max_ngram))
        assert np.all(starts[1:] >= starts[:-1] + lengths[:-1]), "spans overlap"
        union = np.zeros(m, dtype=bool)
        for s, n in zip(starts, lengths):
            union[s:s + n] = True
        assert np.array_equal(mask, union & eligible)
        assert not mask[~eligible].any()
        n_eligible = eligible.sum()
        expected_count = ratio * n_eligible
        assert abs(mask.sum() - expected_count) < 1.0  # stochastic rounding of the target
        full_lengths.extend(lengths[:-1].tolist())  # last span in order may be trimmed
    counts = np.bincount(full_lengths, minlength=max_ngram + 1)[1:]
    if max_ngram > 1:
        p = np.ones(max_ngram) if law == "uniform" else 1.0 / np.arange(1, max_ngram + 1)
        # spans touching the end of the part are cut, so compare shapes loosely
        freq = counts / counts.sum()
        assert np.all(np.abs(freq - p / p.sum()) < 0.03)


def mean_masked_run(mask):
    runs, n = [], 0
    for m in mask:
        if m:
            n += 1
        elif n:
            runs.append(n)
            n = 0
    if n:
        runs.append(n)
    return np.mean(runs) if runs else 0.0


def test_span_mode_masks_contiguous_spans_token_mode_does_not():
    def suffix_runs(unit):
        cfg = ObjectiveConfig(suffix_unit=unit, beta_y_range=(0.05, 0.1))
        return np.mean([mean_masked_run(o["loss_mask"][o["prefix_len"]:].astype(bool))
                        for _, o in draws(cfg, 300, 512, seed=5)])

    assert suffix_runs("span") > 1.8  # uniform 1..3 spans: mean 2, plus rare merges
    assert suffix_runs("token") < 1.15


@pytest.mark.parametrize(
    "cfg",
    [
        ObjectiveConfig(),
        ObjectiveConfig(suffix_unit="token", replacement="bert"),
        ObjectiveConfig(variant="mlm", mlm_ratio=0.5),
        ObjectiveConfig(variant="no_attn", beta_y_range=(0.9, 1.0)),
    ],
    ids=["biglm-span", "token-bert", "mlm", "no_attn"],
)
def test_specials_never_masked_and_labels_exact(cfg):
    rng = np.random.default_rng(6)
    for i in range(300):
        toks = text_like(rng, 200, special_rate=0.25)
        out = apply_objective(toks, cfg, np.random.default_rng(i), MASK, SPECIALS, vocab_size=VOCAB)
        masked = out["loss_mask"].astype(bool)
        special = np.isin(toks, SPECIALS)
        assert masked.any()
        assert not masked[special].any()
        assert np.array_equal(out["input_ids"][special], toks[special])
        assert np.array_equal(out["labels"][masked], toks[masked])
        assert np.all(out["labels"][~masked] == IGNORE_INDEX)
        assert np.array_equal(out["input_ids"][~masked], toks[~masked])
        if cfg.replacement == "mask":
            assert np.all(out["input_ids"][masked] == MASK)
        assert out["input_ids"].dtype == np.int64 and out["loss_mask"].dtype == np.float32


def test_mlm_masks_about_mlm_ratio_with_no_split():
    cfg = ObjectiveConfig(variant="mlm")
    fracs = []
    for toks, o in draws(cfg, 400, 512, seed=7):
        assert o["split"] == 0 and o["prefix_len"] == 0
        fracs.append(o["loss_mask"].mean())
    assert abs(np.mean(fracs) - 0.15) < 0.003
    assert np.max(np.abs(np.array(fracs) - 0.15)) <= 1 / 512 + 1e-9  # exact count, not Bernoulli


def test_no_attn_masks_like_biglm_but_attends_fully():
    rng = np.random.default_rng(8)
    for i in range(50):
        toks = text_like(rng, 300)
        a = apply_objective(toks, ObjectiveConfig(), np.random.default_rng(i), MASK, SPECIALS)
        b = apply_objective(toks, ObjectiveConfig(variant="no_attn"), np.random.default_rng(i), MASK, SPECIALS)
        assert np.array_equal(a["input_ids"], b["input_ids"]) and np.array_equal(a["labels"], b["labels"])
        assert b["split"] == 0 and b["prefix_len"] == a["split"] > 0
        assert not dense_split_mask(torch.tensor([b["split"]]), 300).any()  # split 0: full attention


def test_biglm_split_blocks_prefix_to_suffix_attention():
    toks = text_like(np.random.default_rng(9), 64)
    out = apply_objective(toks, ObjectiveConfig(), np.random.default_rng(0), MASK, SPECIALS)
    s = out["split"]
    mask = dense_split_mask(torch.tensor([s]), 64)[0, 0]
    assert mask[:s, s:].all() and not mask[:s, :s].any() and not mask[s:].any()


def test_at_least_one_token_masked_even_when_ratios_are_zero():
    cfg = ObjectiveConfig(prefix_mode="uniform", beta_x_range=(0.0, 0.0), beta_y_range=(0.0, 0.0))
    rng = np.random.default_rng(10)
    for i in range(200):
        toks = text_like(rng, 8, special_rate=0.3)
        if np.isin(toks, SPECIALS).all():
            continue
        out = apply_objective(toks, cfg, np.random.default_rng(i), MASK, SPECIALS)
        masked = out["loss_mask"].astype(bool)
        assert masked.sum() == 1 and not np.isin(toks[masked], SPECIALS).any()
        suffix_has_eligible = not np.isin(toks[out["prefix_len"]:], SPECIALS).all()
        assert (np.flatnonzero(masked)[0] >= out["prefix_len"]) == suffix_has_eligible


def test_all_special_window_is_a_clear_error():
    with pytest.raises(ValueError, match="no maskable token"):
        apply_objective(np.full(10, EOS), ObjectiveConfig(), np.random.default_rng(0), MASK, SPECIALS)


@pytest.mark.parametrize("bad", [np.zeros((2, 3), dtype=np.int64), np.zeros(0, dtype=np.int64), np.ones(4) * 0.5])
def test_bad_tokens_are_rejected(bad):
    with pytest.raises(ValueError, match="1-D integer"):
        apply_objective(bad, ObjectiveConfig(), np.random.default_rng(0), MASK)


@pytest.mark.parametrize("bad_id", [-1, VOCAB])
def test_ids_outside_the_vocab_are_a_clear_error(bad_id):
    toks = text_like(np.random.default_rng(0), 50)
    toks[7] = bad_id
    with pytest.raises(ValueError, match="outside .0, vocab_size"):
        apply_objective(toks, ObjectiveConfig(), np.random.default_rng(0), MASK, SPECIALS, vocab_size=VOCAB)


def test_same_seed_same_sample_other_seed_other_sample():
    toks = text_like(np.random.default_rng(11), 256)
    cfg = ObjectiveConfig()
    a, b, c = (apply_objective(toks, cfg, np.random.default_rng(s), MASK, SPECIALS) for s in ([1, 5], [1, 5], [1, 6]))
    assert all(np.array_equal(a[k], b[k]) for k in ("input_ids", "labels", "loss_mask")) and a["split"] == b["split"]
    assert not np.array_equal(a["loss_mask"], c["loss_mask"])


def test_bert_replacement_80_10_10():
    cfg = ObjectiveConfig(variant="mlm", mlm_ratio=0.5, replacement="bert")
    kinds = np.zeros(3)
    rng = np.random.default_rng(12)
    for i in range(200):
        toks = text_like(rng, 500)
        out = apply_objective(toks, cfg, np.random.default_rng(i), MASK, SPECIALS, vocab_size=VOCAB)
        m = out["loss_mask"].astype(bool)
        got, orig = out["input_ids"][m], toks[m]
        assert not np.isin(got[got != MASK], SPECIALS).any(), "random replacement drew a special id"
        kinds += [(got == MASK).sum(), ((got != MASK) & (got != orig)).sum(), (got == orig).sum()]
    freq = kinds / kinds.sum()
    # a random draw equals the original with prob 1/|allowed|: negligible at this vocab
    assert np.all(np.abs(freq - [0.8, 0.1, 0.1]) < 0.01)
    with pytest.raises(ValueError, match="vocab_size"):
        apply_objective(toks, cfg, np.random.default_rng(0), MASK, SPECIALS)


def test_random_replacements_uniform_over_allowed_ids():
    excluded = (0, 3, 9)
    draws_ = _random_replacements(40000, 10, excluded, np.random.default_rng(13))
    counts = np.bincount(draws_, minlength=10)
    assert counts[list(excluded)].sum() == 0
    assert stats.chisquare(counts[[i for i in range(10) if i not in excluded]]).pvalue > 1e-3


def test_select_tokens_exact_count_and_uniform_positions():
    rng = np.random.default_rng(14)
    eligible = np.ones(40, dtype=bool)
    eligible[::5] = False
    hits = np.zeros(40)
    for _ in range(3000):
        mask = select_tokens(eligible, 0.25, rng)
        assert mask.sum() == 8 and not mask[~eligible].any()  # 0.25 × 32 is an integer
        hits += mask
    assert stats.chisquare(hits[eligible]).pvalue > 1e-3
