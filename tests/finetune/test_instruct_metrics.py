"""IPR against closed-form integrals; Distinct-2 and BLEU-2 (sacrebleu) against values worked
out by hand."""
from __future__ import annotations

import math

import pytest

from megatron_biglm.finetune.metrics.generation import distinct_n, genset_scores
from megatron_biglm.finetune.metrics.ipr import ipr, ipr_over_seeds, trapezoid

GRID = [0, 8, 16, 32, 64, 128]


def test_ipr_matches_closed_form_curves():
    # linear curves are integrated exactly by the trapezoid rule
    f = {n: 0.6 + 0.002 * n for n in GRID}      # ∫0^128 = 0.6*128 + 0.001*128² = 93.184
    g = {n: 0.5 + 0.001 * n for n in GRID}      # ∫0^128 = 64 + 0.0005*128² = 72.192
    value, ns = ipr(f, g)
    assert ns == GRID and value == pytest.approx(93.184 / 72.192 - 1, rel=1e-12)
    assert ipr({n: 0.55 for n in GRID}, {n: 0.5 for n in GRID})[0] == pytest.approx(0.1)  # constant: 10 %
    assert ipr(g, g)[0] == 0.0
    # a convex curve: trapezoid error is what the closed form says (x² on [0,128] → 128³/3)
    exact = 128 ** 3 / 3
    assert trapezoid(GRID, [n * n for n in GRID]) == pytest.approx(
        exact + sum((b - a) ** 3 / 6 for a, b in zip(GRID, GRID[1:])))


def test_n0_is_integrated_only_where_both_curves_have_it():
    head = {n: 0.5 + 0.001 * n for n in GRID[1:]}      # no N = 0
    prompted = {n: 0.6 for n in GRID}
    value, ns = ipr(prompted, head)
    assert ns == GRID[1:]
    assert value == pytest.approx(0.6 * 120 / (0.5 * 120 + 0.0005 * (128 ** 2 - 8 ** 2)) - 1)
    with pytest.raises(ValueError, match="common N"):
        ipr({0: 1.0, 8: 1.0}, {16: 1.0, 32: 1.0})


def test_ipr_over_seeds_mean_and_std():
    f = [{n: 0.55 for n in GRID}, {n: 0.66 for n in GRID}]
    g = [{n: 0.5 for n in GRID}, {n: 0.6 for n in GRID}]
    out = ipr_over_seeds(f, g)
    assert out["per_seed"] == pytest.approx([0.1, 0.1]) and out["std"] == pytest.approx(0.0, abs=1e-12)
    assert out["of_mean_curves"] == pytest.approx(0.605 / 0.55 - 1) and out["n_range"] == [0, 128]


def test_distinct_2_by_hand():
    texts = ["the cat sat", "the cat ran", "A a"]
    # bigrams: (the,cat) (cat,sat) (the,cat) (cat,ran) (a,a) -> 4 distinct of 5
    assert distinct_n(texts, 2) == pytest.approx(4 / 5)
    assert distinct_n(["one", "two"], 2) == 0.0 and distinct_n(texts, 1) == pytest.approx(5 / 8)


def test_bleu_2_by_hand():
    hyp, ref = "the cat sat on the mat", "the cat is on the mat"
    # unigram precision 5/6, bigram 3/5 (the cat, on the, the mat), equal lengths: BP = 1
    scores = genset_scores([hyp], [ref])
    assert scores["bleu2"] == pytest.approx(math.sqrt(5 / 6 * 3 / 5), abs=1e-6)
    assert scores["distinct2"] == 1.0
    # a shorter hypothesis pays the brevity penalty exp(1 - r/c): r = 6, c = 4
    short = genset_scores(["the cat on the"], [ref])["bleu2"]
    assert short == pytest.approx(math.exp(1 - 6 / 4) * math.sqrt(4 / 4 * 2 / 3), abs=1e-6)
