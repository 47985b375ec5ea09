"""The split rule is single: every attention representation equals `split_rule.visible` exactly.

`visible` is first checked against the rule as the paper states it (Python loops over
positions); then, on random batches (random b, s, splits in [0, valid length], right padding
or none, block sizes that do not divide s), each representation is expanded back to a
per-(query, key) bool grid and compared with `visible`'s grid: the dense masks in both
conventions, the additive 4D masks, the FlexAttention BlockMask (its block lists and
mask_mod, materialised on CPU), the flash varlen lengths, and the model's choice of mask.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_biglm.model.attention_masks import (
    block_causal_mask,
    additive_mask,
    additive_split_mask,
    dense_split_mask,
    dense_visible_mask,
    flex_split_block_mask,
    sequence_mask,
    split_groups,
    suffix_after_prefix_mask,
    varlen_segments,
    varlen_split_lengths,
)
from megatron_biglm.objective.split_rule import (
    VARIANTS,
    attention_split,
    restricting_lengths,
    restricting_split,
    restricts_attention,
    visible,
)

TRIALS = 60


def spec(q: int, k: int, split: int, valid: int) -> bool:
    """The rule in words: a real key, and the query is a suffix row or the key a prefix key."""
    key_is_real = k < valid
    query_in_suffix = q >= split
    key_in_prefix = k < split
    return key_is_real and (query_in_suffix or key_in_prefix)


def random_case(gen, max_b=5, max_s=70):
    """(split [b], seq_len, valid [b] or None): splits in [0, valid], edges drawn often."""
    b = int(torch.randint(1, max_b + 1, (1,), generator=gen))
    s = int(torch.randint(1, max_s + 1, (1,), generator=gen))
    padded = bool(torch.rand(1, generator=gen) < 0.5)
    valid = torch.randint(1, s + 1, (b,), generator=gen) if padded else None
    limit = valid if padded else torch.full((b,), s)
    split = (torch.rand(b, generator=gen) * (limit + 1)).long().clamp(max=limit)
    edge = torch.rand(b, generator=gen)
    split = torch.where(edge < 0.15, 0, torch.where(edge > 0.85, limit, split))
    return split, s, valid


def rule_grid(split, s, valid=None) -> torch.Tensor:
    """`visible` over every (query, key) of the batch: bool [b, s, s], True = may attend."""
    valid = torch.full_like(split, s) if valid is None else valid
    pos = torch.arange(s)
    return visible(pos.view(1, s, 1), pos.view(1, 1, s), split.view(-1, 1, 1), valid.view(-1, 1, 1))


def cases(seed, n=TRIALS, **kw):
    gen = torch.Generator().manual_seed(seed)
    return [random_case(gen, **kw) for _ in range(n)]


# --- the rule itself ------------------------------------------------------------------------

def test_visible_is_the_stated_rule():
    for split, s, valid in cases(0, n=30, max_s=16):
        grid = rule_grid(split, s, valid)
        lengths = valid if valid is not None else torch.full_like(split, s)
        for i, q, k in itertools.product(range(len(split)), range(s), range(s)):
            assert bool(grid[i, q, k]) == spec(q, k, int(split[i]), int(lengths[i])), (i, q, k)


def test_split_zero_is_full_attention_over_real_keys():
    for split, s, valid in cases(1):
        zero = torch.zeros_like(split)
        lengths = valid if valid is not None else torch.full_like(split, s)
        real = (torch.arange(s).view(1, 1, s) < lengths.view(-1, 1, 1)).expand(-1, s, -1)
        assert torch.equal(rule_grid(zero, s, valid), real)


def test_no_row_is_fully_masked():
    for split, s, valid in cases(2):
        assert rule_grid(split, s, valid).any(dim=-1).all()


def test_only_biglm_restricts_and_the_others_carry_split_zero():
    assert [restricts_attention(v) for v in VARIANTS] == [v == "biglm" for v in VARIANTS]
    cut = torch.tensor([4, 0, 7])
    for variant in VARIANTS:
        expected = cut if restricts_attention(variant) else torch.zeros_like(cut)
        assert torch.equal(attention_split(cut, variant), expected)
        assert attention_split(5, variant) == (5 if restricts_attention(variant) else 0)
    with pytest.raises(ValueError, match="unknown objective variant"):
        restricts_attention("causal")
    assert restricting_split(None) is None
    assert restricting_split(torch.zeros(3, dtype=torch.long)) is None
    assert torch.equal(restricting_split(cut), cut)


def _batch_of_lengths(max_over: int):
    """(seq_len, valid lengths [b] in [1, seq_len + max_over], dtype): full rows drawn often."""
    def draw(s):
        entry = st.one_of(st.just(s), st.integers(1, s + max_over))
        return st.tuples(st.just(s), st.lists(entry, min_size=1, max_size=9),
                         st.sampled_from([torch.int64, torch.int32]))
    return st.integers(1, 80).flatmap(draw)


@settings(max_examples=300, deadline=None)
@given(_batch_of_lengths(max_over=0))
def test_restricting_lengths_drops_exactly_the_batches_without_a_padded_row(case):
    s, lengths, dtype = case
    valid = torch.tensor(lengths, dtype=dtype)
    kept = restricting_lengths(valid, s)
    if all(n >= s for n in lengths):
        assert kept is None
        # dropping them changes nothing: the rule with valid = seq_len is the rule without it
        split = torch.tensor([n // 2 for n in lengths])
        assert torch.equal(rule_grid(split, s, valid.long()), rule_grid(split, s))
    else:
        assert kept is valid  # the input itself, unchanged
        assert torch.equal(kept, torch.tensor(lengths, dtype=dtype))
    assert restricting_lengths(None, s) is None


@settings(max_examples=200, deadline=None)
@given(_batch_of_lengths(max_over=4))
def test_a_length_past_the_sequence_is_refused_whether_or_not_a_row_is_padded(case):
    """Dropping all-full lengths must not hide an out-of-range one: the lengths are refused
    either by `restricting_lengths` itself or, when a row is padded, by the builders."""
    pytest.importorskip("megatron.core")
    from megatron_biglm.model.attention_params import build_attention_params

    s, lengths, dtype = case
    if not any(n > s for n in lengths):  # at least one length past the sequence (drawn, not filtered)
        lengths = [s + 1 + (lengths[0] % 4), *lengths[1:]]
    valid = torch.tensor(lengths, dtype=dtype)
    for split in (None, torch.zeros(len(lengths), dtype=torch.long)):
        with pytest.raises(ValueError, match=rf"valid_lengths must lie in \[1, seq_len={s}\]"):
            build_attention_params(split, s, "sdpa", valid_lengths=valid)
    with pytest.raises(ValueError, match=r"valid_lengths must be a 1-D tensor \[batch\]"):
        restricting_lengths(torch.full((len(lengths), 1), s), s)


# --- dense bool, both conventions -----------------------------------------------------------

def test_dense_masks_in_both_conventions_equal_the_rule():
    for split, s, valid in cases(3):
        grid = rule_grid(split, s, valid)
        masked_out = dense_split_mask(split, s, valid_lengths=valid)
        attend = dense_visible_mask(split, s, valid_lengths=valid)
        assert masked_out.shape == attend.shape == (len(split), 1, s, s)
        assert masked_out.dtype == attend.dtype == torch.bool
        assert torch.equal(masked_out[:, 0], ~grid)  # megatron: True = masked out
        assert torch.equal(attend[:, 0], grid)  # SDPA: True = attend


def test_sequence_mask_equals_the_rule():
    for split, s, valid in cases(4):
        lengths = valid if valid is not None else torch.full_like(split, s)
        assert torch.equal(sequence_mask(lengths, s, split), rule_grid(split, s, lengths))
        # no split: the rule with split 0
        assert torch.equal(sequence_mask(lengths, s, None), rule_grid(torch.zeros_like(split), s, lengths))


def test_block_causal_mask_is_the_segment_order_over_many_draws():
    """A query sees a key iff the key's block is not after the query's (blocks: the prompt, then
    one per start), among the real keys; one start is the plain split."""
    g = torch.Generator().manual_seed(11)
    for _ in range(40):
        b, s = 3, int(torch.randint(2, 20, (1,), generator=g))
        lengths = torch.randint(1, s + 1, (b,), generator=g)
        m = int(torch.randint(1, 5, (1,), generator=g))
        starts = torch.sort(torch.randint(0, s + 1, (b, m), generator=g), dim=1).values
        got = block_causal_mask(lengths, s, starts)
        for r in range(b):
            block = [int((starts[r] <= i).sum()) for i in range(s)]
            want = torch.tensor([[block[k] <= block[q] and k < int(lengths[r]) for k in range(s)]
                                 for q in range(s)])
            assert torch.equal(got[r], want)
        # ... which is the split rule applied at every start; one start is the plain split
        rule = sequence_mask(lengths, s, None)
        for j in range(m):
            rule = rule & sequence_mask(lengths, s, starts[:, j])
        assert torch.equal(got, rule)
        assert torch.equal(block_causal_mask(lengths, s, starts[:, :1]), sequence_mask(lengths, s, starts[:, 0]))


def test_cached_prefix_mask_equals_the_rule_on_the_whole_sequence():
    """Suffix queries over [padded prefix, padded suffix] keys see what they would see in the
    whole sequence prefix + suffix cut at the prefix length."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(TRIALS):
        b = int(torch.randint(1, 5, (1,), generator=gen))
        p_width, q_width = (int(x) for x in torch.randint(1, 20, (2,), generator=gen))
        p_len = torch.randint(0, p_width + 1, (b,), generator=gen)
        q_len = torch.randint(1, q_width + 1, (b,), generator=gen)
        got = suffix_after_prefix_mask(p_len, p_width, q_len, q_width)
        assert got.shape == (b, q_width, p_width + q_width)
        for i in range(b):
            P, Q = int(p_len[i]), int(q_len[i])
            whole = rule_grid(torch.tensor([P]), p_width + q_width, torch.tensor([P + Q]))[0]
            # slot -> absolute position in the whole sequence (None: a padding slot)
            slots = [j if j < P else None for j in range(p_width)]
            slots += [P + t if t < Q else None for t in range(q_width)]
            for t in range(Q):  # real query rows
                expected = [a is not None and bool(whole[P + t, a]) for a in slots]
                assert got[i, t].tolist() == expected, (i, t)


# --- additive 4D ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_additive_masks_equal_the_rule(dtype):
    gen = torch.Generator().manual_seed(6)
    low = torch.finfo(dtype).min
    for split, s, valid in cases(6):
        lengths = valid if valid is not None else torch.full_like(split, s)
        grid = rule_grid(split, s, lengths)
        # right padding as a 2D attention mask
        padding = (torch.arange(s)[None] < lengths[:, None]).long()
        for mask in (additive_split_mask(split, s, attention_mask=padding, dtype=dtype),
                     additive_mask(grid, dtype)):
            assert mask.shape == (len(split), 1, s, s) and mask.dtype == dtype
            assert torch.equal(mask[:, 0] == 0, grid)
            assert bool((mask[:, 0][~grid] == low).all())
        # any padding side: a real-key mask (the rule with key_real instead of a length)
        real = torch.rand(len(split), s, generator=gen) < 0.8
        real[:, 0] = True
        got = additive_split_mask(split, s, attention_mask=real.long(), dtype=dtype)[:, 0]
        pos = torch.arange(s)
        expected = visible(pos.view(1, s, 1), pos.view(1, 1, s), split.view(-1, 1, 1), key_real=real[:, None, :])
        assert torch.equal(got == 0, expected)
        # no padding mask: every key real
        assert torch.equal(additive_split_mask(split, s, dtype=dtype)[:, 0] == 0, rule_grid(split, s))


# --- FlexAttention BlockMask ----------------------------------------------------------------

def materialise(bm, b, s, q_bs, kv_bs, *, q_major: bool) -> torch.Tensor:
    """The bool [b, s, s] a BlockMask lets through: full blocks entirely, partial blocks where
    mask_mod says so, nothing elsewhere. Read from the kv-major lists (what the forward kernel
    visits) or from the q-major lists (what the backward kernel visits)."""
    out = torch.zeros(b, s, s, dtype=torch.bool)
    q = torch.arange(s).view(-1, 1)
    k = torch.arange(s).view(1, -1)
    if q_major:
        lists = ((bm.full_q_num_blocks, bm.full_q_indices, True), (bm.q_num_blocks, bm.q_indices, False))
    else:
        lists = ((bm.full_kv_num_blocks, bm.full_kv_indices, True), (bm.kv_num_blocks, bm.kv_indices, False))
    for i in range(b):
        through = bm.mask_mod(torch.tensor(i), torch.tensor(0), q, k)
        for num, idx, full in lists:
            for row in range(num.shape[-1]):
                for col in idx[i, 0, row, : int(num[i, 0, row])].tolist():
                    qb, kb = (col, row) if q_major else (row, col)
                    rows = slice(qb * q_bs, min((qb + 1) * q_bs, s))
                    cols = slice(kb * kv_bs, min((kb + 1) * kv_bs, s))
                    assert not out[i, rows, cols].any(), "a block listed twice"
                    out[i, rows, cols] = True if full else through[rows, cols]
    return out


def test_flex_block_mask_equals_the_rule():
    gen = torch.Generator().manual_seed(7)
    for split, s, valid in cases(7, n=40):
        q_bs = int(torch.randint(1, 24, (1,), generator=gen))
        kv_bs = q_bs if torch.rand(1, generator=gen) < 0.7 else int(torch.randint(1, 24, (1,), generator=gen))
        bm = flex_split_block_mask(split, s, block_size=(q_bs, kv_bs), valid_lengths=valid)
        grid = rule_grid(split, s, valid)
        for q_major in (False, True):
            assert torch.equal(materialise(bm, len(split), s, q_bs, kv_bs, q_major=q_major), grid), q_major
        # mask_mod alone is the rule (the kernel applies it inside partial blocks)
        q, k = torch.arange(s).view(-1, 1), torch.arange(s).view(1, -1)
        for i in range(len(split)):
            assert torch.equal(bm.mask_mod(torch.tensor(i), torch.tensor(0), q, k), grid[i])


# --- flash varlen ---------------------------------------------------------------------------

def expand_varlen(v, s) -> torch.Tensor:
    """Re-expand a VarlenSplit into bool [b, s, s]: which keys each query row's call sees."""
    out = torch.zeros(v.batch_size, s, s, dtype=torch.bool)
    calls = ((v.prefix_index, v.prefix_cu_seqlens, v.prefix_index, v.prefix_cu_seqlens,
              v.prefix_max_seqlen, v.prefix_max_seqlen),
             (v.suffix_index, v.suffix_cu_seqlens_q, v.kv_index, v.suffix_cu_seqlens_k,
              v.suffix_max_seqlen_q, v.suffix_max_seqlen_k))
    for q_rows, cu_q, kv_rows, cu_k, max_q, max_k in calls:
        assert cu_q.dtype == cu_k.dtype == torch.int32
        assert int(cu_q[-1]) == q_rows.numel() and int(cu_k[-1]) == kv_rows.numel()
        lens_q, lens_k = cu_q.diff(), cu_k.diff()
        assert max_q == int(lens_q.max()) and max_k == int(lens_k.max())
        for seg in range(v.batch_size):
            qs = q_rows[cu_q[seg]:cu_q[seg + 1]]
            ks = kv_rows[cu_k[seg]:cu_k[seg + 1]]
            assert bool((qs // s == seg).all()) and bool((ks // s == seg).all()), "segment mixes samples"
            out[seg, (qs % s)[:, None], (ks % s)[None, :]] = True
    return out


def test_varlen_lengths_equal_the_rule_on_real_rows():
    for split, s, valid in cases(8):
        v = varlen_split_lengths(split, s, valid_lengths=valid)
        lengths = valid if valid is not None else torch.full_like(split, s)
        real_rows = torch.arange(s).view(1, s, 1) < lengths.view(-1, 1, 1)
        got = expand_varlen(v, s)
        assert torch.equal(got, rule_grid(split, s, valid) & real_rows)
        # every real row is in exactly one call, padding rows in none (their output stays 0)
        rows = torch.cat([v.prefix_index, v.suffix_index])
        assert rows.unique().numel() == rows.numel() == int(lengths.sum())


def expand_groups(groups, s: int) -> torch.Tensor:
    """The (query, key) pairs the grouped SDPA calls compute, as a bool grid [b, s, s]."""
    out = torch.zeros(groups.batch_size, s, s, dtype=torch.bool)
    for samples, p, v in groups.groups:
        for i in samples:
            out[i, :p, :p] = True   # call 1: prefix rows x prefix keys
            out[i, p:, :v] = True   # call 2: suffix rows (padded ones too) x valid keys
    return out


def expand_segments(seg, s: int) -> torch.Tensor:
    """The pairs of the one varlen call: segment j's query rows (natural order) x its gathered keys."""
    out = torch.zeros(seg.batch_size * s, seg.batch_size * s, dtype=torch.bool)
    for j in range(seg.cu_seq_q.numel() - 1):
        rows = torch.arange(int(seg.cu_seq_q[j]), int(seg.cu_seq_q[j + 1]))
        keys = seg.kv_index[int(seg.cu_seq_k[j]):int(seg.cu_seq_k[j + 1])]
        out[rows.view(-1, 1), keys.view(1, -1)] = True
    b = seg.batch_size
    same_sample = torch.stack([out[i * s:(i + 1) * s, i * s:(i + 1) * s] for i in range(b)])
    assert int(same_sample.sum()) == int(out.sum())  # no pair crosses samples
    return same_sample


def test_segments_compute_exactly_the_visible_pairs():
    """The grouped SDPA calls and the one varlen call cover the rule's pairs, each once (the
    prefix keys referenced twice by the varlen call): p² + (s − p)·v pairs per sample."""
    for split, s, valid in cases(10):
        grid = rule_grid(split, s, valid)
        assert torch.equal(expand_groups(split_groups(split, s, valid_lengths=valid), s), grid)
        seg = varlen_segments(split, s, valid_lengths=valid)
        assert torch.equal(expand_segments(seg, s), grid)
        lengths = valid if valid is not None else torch.full_like(split, s)
        assert seg.kv_index.numel() == int((split + lengths).sum())
        assert int(grid.sum()) == int((split * split + (s - split) * lengths).sum())


# --- the model's choice of representation ---------------------------------------------------

def test_model_builds_each_backend_mask_from_the_rule_and_none_for_split_zero():
    pytest.importorskip("megatron.core")
    from megatron_biglm.model.attention_params import build_attention_params

    for split, s, valid in cases(9, n=20):
        grid = rule_grid(split, s, valid)
        if restricting_split(split) is not None or restricting_lengths(valid, s) is not None:
            dense = build_attention_params(split, s, "sdpa", valid_lengths=valid)
            assert torch.equal(dense.derived[:, 0], grid)
            local = build_attention_params(split, s, "local", valid_lengths=valid)
            assert torch.equal(~local.derived[:, 0], grid)
            flex = build_attention_params(split, s, "flex", valid_lengths=valid)
            assert torch.equal(materialise(flex.derived.block_mask, len(split), s, 128, 128, q_major=False), grid)
            flash = build_attention_params(split, s, "flash", valid_lengths=valid)
            lengths = valid if valid is not None else torch.full_like(split, s)
            real_rows = torch.arange(s).view(1, s, 1) < lengths.view(-1, 1, 1)
            assert torch.equal(expand_varlen(flash.derived, s), grid & real_rows)
            grouped = build_attention_params(split, s, "sdpa_split", valid_lengths=valid)
            assert torch.equal(expand_groups(grouped.derived, s), grid)
            varlen = build_attention_params(split, s, "varlen", valid_lengths=valid)
            assert torch.equal(expand_segments(varlen.derived, s), grid)
    # split 0 everywhere (mlm/no_attn) without padding: full attention, no mask built at all;
    # lengths that pad no row are no padding
    full = torch.full((3,), 9)
    for backend in ("sdpa", "local", "flex", "flash", "sdpa_split", "varlen"):
        assert build_attention_params(torch.zeros(3, dtype=torch.long), 9, backend).is_full_attention
        assert build_attention_params(None, 9, backend).is_full_attention
        assert build_attention_params(None, 9, backend, valid_lengths=full).is_full_attention
        assert build_attention_params(torch.zeros(3, dtype=torch.long), 9, backend,
                                      valid_lengths=full).is_full_attention


def test_all_full_lengths_beside_a_restricting_split_build_what_no_lengths_build():
    """With a restricting split, lengths that pad no row are dropped: each backend builds
    exactly the representation it builds for the split alone."""
    pytest.importorskip("megatron.core")
    from megatron_biglm.model.attention_params import build_attention_params

    for split, s, _ in cases(12, n=20):
        if restricting_split(split) is None:
            continue
        full = torch.full_like(split, s)
        for backend in ("sdpa", "flex", "flash", "sdpa_split", "varlen"):
            given_full = build_attention_params(split, s, backend, valid_lengths=full)
            without = build_attention_params(split, s, backend)
            assert not given_full.is_full_attention
            if backend == "sdpa":
                assert torch.equal(given_full.derived, without.derived)
            elif backend == "flex":
                held = [t for t in given_full.derived.block_mask.as_tuple() if isinstance(t, torch.Tensor)]
                bare = [t for t in without.derived.block_mask.as_tuple() if isinstance(t, torch.Tensor)]
                assert len(held) == len(bare) >= 4 and all(map(torch.equal, held, bare))
            elif backend == "flash":
                assert _same_fields(given_full.derived, without.derived)
            elif backend == "sdpa_split":
                assert given_full.derived == without.derived
            else:
                assert _same_fields(given_full.derived, without.derived)


def _same_fields(a, b) -> bool:
    import dataclasses

    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
            return False
    return True
