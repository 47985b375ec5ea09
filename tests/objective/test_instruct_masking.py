"""“Scaling Effects of Instruction Tuning” §3.1 masking over many draws: ~15 % of the eligible input tokens, never a
template or special token, every target token; in the biglm variant no input row attends a
target key (checked through the split rule and the dense mask the CPU backend uses)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_biglm.objective.instruct import INPUT, TARGET, TEMPLATE, mask_instruction, target_span
from megatron_biglm.objective.split_rule import visible

MASK, BOS, EOS = 3, 0, 1


def _sample(rng):
    """[BOS] tmpl input tmpl target tmpl [EOS], random lengths; one input token is a special id."""
    parts = [([BOS], TEMPLATE), (rng.integers(10, 20, 3), TEMPLATE), (rng.integers(20, 90, rng.integers(5, 40)), INPUT),
             (rng.integers(10, 20, 2), TEMPLATE), (rng.integers(20, 90, rng.integers(1, 4)), TARGET),
             (rng.integers(10, 20, 1), TEMPLATE), ([EOS], TEMPLATE)]
    tokens = np.concatenate([np.asarray(p) for p, _ in parts]).astype(np.int64)
    roles = np.concatenate([np.full(len(p), r, np.uint8) for p, r in parts])
    tokens[np.flatnonzero(roles == INPUT)[0]] = EOS  # a special id inside the input: never masked
    return tokens, roles


@pytest.mark.parametrize("variant", ["biglm", "mlm"])
def test_mask_ratio_roles_and_target_over_many_draws(variant):
    rng = np.random.default_rng(0)
    eligible_total = masked_total = 0
    for draw in range(3000):
        tokens, roles = _sample(rng)
        out = mask_instruction(tokens, roles, np.random.default_rng([7, draw]), MASK, special_ids=(BOS, EOS),
                               variant=variant)
        masked = out["loss_mask"] == 1
        start, end = target_span(roles)
        assert masked[start:end].all() and (out["input_ids"][start:end] == MASK).all()  # whole target, always
        assert not masked[roles == TEMPLATE].any()                                      # never the template
        assert not masked[np.isin(tokens, (BOS, EOS))].any()                            # never a special id
        assert (out["labels"][masked] == tokens[masked]).all() and (out["labels"][~masked] == -100).all()
        assert (out["input_ids"][~masked] == tokens[~masked]).all()
        assert out["split"] == (start if variant == "biglm" else 0)
        eligible = (roles == INPUT) & ~np.isin(tokens, (BOS, EOS))
        eligible_total += int(eligible.sum())
        masked_total += int((masked & eligible).sum())
        assert out["input_masked"] == int((masked & eligible).sum())
    ratio = masked_total / eligible_total
    assert abs(ratio - 0.15) < 0.005, ratio  # ~60k eligible tokens: sd of the ratio ~0.0015


def test_biglm_input_rows_never_attend_target_keys():
    from megatron_biglm.model.attention_masks.dense import dense_visible_mask

    rng = np.random.default_rng(1)
    for draw in range(200):
        tokens, roles = _sample(rng)
        out = mask_instruction(tokens, roles, np.random.default_rng(draw), MASK, special_ids=(BOS, EOS))
        n, split = len(tokens), out["split"]
        q, k = torch.arange(n).view(-1, 1), torch.arange(n).view(1, -1)
        seen = visible(q, k, split)
        before = torch.from_numpy(roles != TARGET).cumprod(0).bool()  # rows before the target: input side
        target = torch.from_numpy(roles == TARGET)
        assert not seen[before][:, target].any()        # no input/template row sees a target key
        assert seen[target].all()                        # target rows see everything
        dense = dense_visible_mask(torch.tensor([split]), n)[0, 0]
        assert torch.equal(dense, seen)


def test_mlm_variant_attends_fully_and_bad_samples_fail_clearly():
    tokens, roles = _sample(np.random.default_rng(2))
    out = mask_instruction(tokens, roles, np.random.default_rng(0), MASK, variant="mlm")
    assert out["split"] == 0 and visible(torch.arange(3).view(-1, 1), torch.arange(3).view(1, -1), 0).all()
    with pytest.raises(ValueError, match="no TARGET"):
        mask_instruction(tokens, np.where(roles == TARGET, INPUT, roles), np.random.default_rng(0), MASK)
    broken = roles.copy()
    broken[np.flatnonzero(roles == INPUT)[2]] = TARGET
    with pytest.raises(ValueError, match="contiguous"):
        mask_instruction(tokens, broken, np.random.default_rng(0), MASK)
