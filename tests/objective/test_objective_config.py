"""ObjectiveConfig: defaults of the reference, dict round-trips and clear errors."""
from __future__ import annotations

import pytest

from megatron_biglm.objective import ObjectiveConfig


def test_defaults_are_the_reference_objective():
    cfg = ObjectiveConfig()
    assert (cfg.variant, cfg.alpha, cfg.prefix_mode, cfg.lambda1, cfg.lambda2) == ("biglm", 0.2, "adaptive", 0.3, 0.2)
    assert cfg.beta_y_range == (0.0, 1.0) and (cfg.suffix_unit, cfg.max_ngram) == ("span", 3)
    assert cfg.mlm_ratio == 0.15 and cfg.replacement == "mask" and cfg.restricts_attention


def test_from_dict_round_trip_and_list_ranges():
    cfg = ObjectiveConfig.from_dict({"alpha": 0.3, "beta_y_range": [0.1, 0.9], "variant": "no_attn"})
    assert cfg.beta_y_range == (0.1, 0.9) and not cfg.restricts_attention
    assert ObjectiveConfig.from_dict(cfg.to_dict()) == cfg
    assert ObjectiveConfig.from_dict(None) == ObjectiveConfig()


def test_unknown_key_names_the_key_and_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown ObjectiveConfig keys \['lamda1'\].*lambda1"):
        ObjectiveConfig.from_dict({"lamda1": 0.5})


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"variant": "gpt"}, "variant"),
        ({"suffix_unit": "word"}, "suffix_unit"),
        ({"alpha": 0.5}, "alpha"),
        ({"beta_y_range": (0.8, 0.2)}, "beta_y_range"),
        ({"lambda1": 0.1, "lambda2": 0.5}, "adaptive"),
        ({"max_ngram": 0}, "max_ngram"),
        ({"mlm_ratio": 0.0}, "mlm_ratio"),
        ({"bert_probs": (0.8, 0.1, 0.2)}, "bert_probs"),
        ({"replacement": "random"}, "replacement"),
    ],
)
def test_invalid_values_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ObjectiveConfig(**kwargs)


def test_table8_ablations_are_expressible():
    for alpha in (0.1, 0.2, 0.3, 0.4):
        assert ObjectiveConfig(alpha=alpha).alpha == alpha
    for l1, l2 in ((0.3, 0.2), (0.5, 0.2), (0.5, 0.4), (0.4, 0.2)):
        cfg = ObjectiveConfig(lambda1=l1, lambda2=l2)
        assert (cfg.lambda1, cfg.lambda2) == (l1, l2)
    for rng in ((0.1, 0.9), (0.2, 0.8), (0.3, 0.7)):
        assert tuple(ObjectiveConfig(beta_y_range=rng).beta_y_range) == rng


@pytest.mark.parametrize("alpha", [0.0, -0.1, 0.5, 0.7])
def test_alpha_outside_the_open_interval_is_refused(alpha):
    # The paper's split i lies strictly inside (1, L): alpha = 0 would allow 0 or L.
    with pytest.raises(ValueError, match=r"alpha=.* must be in \(0, 0.5\)"):
        ObjectiveConfig(alpha=alpha)


def test_draw_split_never_returns_0_or_L():
    import numpy as np

    from megatron_biglm.objective.apply import draw_split

    rng = np.random.default_rng(0)
    for seq_len in (2, 3, 5, 17):
        for alpha in (0.01, 0.2, 0.49):
            cuts = {draw_split(seq_len, alpha, rng) for _ in range(200)}
            assert min(cuts) >= 1 and max(cuts) <= seq_len - 1, (seq_len, alpha, cuts)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        draw_split(1, 0.2, rng)
