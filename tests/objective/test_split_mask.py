"""The split-mask representations agree with the brute-force rule and give identical attention."""
from __future__ import annotations

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

from megatron_biglm.model.attention_masks import (
    dense_split_mask,
    flex_split_block_mask,
    split_varlen_attention,
    sdpa_varlen_attention,
    varlen_split_lengths,
)
from megatron_biglm.objective.split_rule import attention_split, restricts_attention


def brute_force_masked_out(split, seq_len, valid=None):
    """Python loops over the spec: allowed(q,k) = (q >= s) or (k < s), keys past padding out."""
    b = len(split)
    out = torch.zeros(b, 1, seq_len, seq_len, dtype=torch.bool)
    for i, q, k in itertools.product(range(b), range(seq_len), range(seq_len)):
        s = int(split[i])
        allowed = (q >= s or k < s) and (valid is None or k < int(valid[i]))
        out[i, 0, q, k] = not allowed
    return out


def random_splits(gen, b, seq_len, with_edges=True):
    split = torch.randint(0, seq_len + 1, (b,), generator=gen)
    if with_edges and b >= 2:
        split[0], split[1] = 0, seq_len  # the two degenerate cuts: full attention both
    return split


@pytest.mark.parametrize("seq_len", [1, 7, 33])
def test_dense_matches_brute_force(seq_len):
    gen = torch.Generator().manual_seed(seq_len)
    for _ in range(5):
        split = random_splits(gen, 4, seq_len)
        assert torch.equal(dense_split_mask(split, seq_len), brute_force_masked_out(split, seq_len))


def test_dense_with_padding_matches_brute_force():
    gen = torch.Generator().manual_seed(0)
    seq_len = 19
    for _ in range(10):
        valid = torch.randint(1, seq_len + 1, (5,), generator=gen)
        split = (torch.rand(5, generator=gen) * (valid + 1)).long().clamp(max=valid)
        got = dense_split_mask(split, seq_len, valid_lengths=valid)
        assert torch.equal(got, brute_force_masked_out(split, seq_len, valid))
        assert not got.all(dim=-1).any(), "a fully masked row would make softmax NaN"


@pytest.mark.parametrize("seq_len,block", [(40, 8), (37, 16), (64, 128)])
def test_flex_block_mask_matches_brute_force(seq_len, block):
    gen = torch.Generator().manual_seed(seq_len)
    split = random_splits(gen, 6, seq_len)
    bm = flex_split_block_mask(split, seq_len, block_size=block)
    # Exact per-element truth of the BlockMask: its mask_mod evaluated on the full grid,
    # restricted to the blocks the BlockMask keeps (partial or full).
    q = torch.arange(seq_len).view(-1, 1)
    k = torch.arange(seq_len).view(1, -1)
    dense_blocks = bm.to_dense()  # [b, 1, nq_blocks, nk_blocks]
    expected = brute_force_masked_out(split, seq_len)
    for i in range(len(split)):
        allowed = bm.mask_mod(torch.tensor(i), torch.tensor(0), q, k)
        kept = dense_blocks[i, 0].repeat_interleave(block, 0).repeat_interleave(block, 1)
        kept = kept[:seq_len, :seq_len].bool()
        assert torch.equal(~(allowed & kept), expected[i, 0])


def test_flex_block_mask_skips_exactly_the_empty_blocks():
    seq_len, block = 64, 16
    split = torch.tensor([0, 16, 40, 64])
    bm = flex_split_block_mask(split, seq_len, block_size=block)
    blocks = bm.to_dense()[:, 0].bool()
    allowed = ~brute_force_masked_out(split, seq_len)[:, 0]
    any_allowed = allowed.view(4, 4, block, 4, block).any(dim=(2, 4))
    assert torch.equal(blocks, any_allowed)


def qkv(gen, b, s, h, d, kv_heads=None):
    kv_heads = kv_heads or h
    return (
        torch.randn(b, h, s, d, generator=gen),
        torch.randn(b, kv_heads, s, d, generator=gen),
        torch.randn(b, kv_heads, s, d, generator=gen),
    )


def reference_attention(q, k, v, split, valid=None):
    mask = dense_split_mask(split, q.shape[2], valid_lengths=valid)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=~mask, enable_gqa=k.shape[1] != q.shape[1])


def brute_force_attention(q, k, v, split):
    """Per-query softmax over the allowed keys only, written out without any mask tensor."""
    b, h, s, d = q.shape
    out = torch.zeros_like(q)
    for i in range(b):
        sp = int(split[i])
        for t in range(s):
            keys = slice(0, s) if t >= sp else slice(0, sp)
            scores = torch.einsum("hd,hnd->hn", q[i, :, t], k[i, :, keys]) / d**0.5
            out[i, :, t] = torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), v[i, :, keys])
    return out


def test_dense_attention_equals_brute_force_softmax():
    gen = torch.Generator().manual_seed(1)
    q, k, v = qkv(gen, 3, 12, 2, 8)
    split = torch.tensor([0, 5, 12])
    torch.testing.assert_close(reference_attention(q, k, v, split), brute_force_attention(q, k, v, split),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seq_len,block,kv_heads", [(48, 16, 4), (70, 32, 2)])
def test_flex_attention_equals_dense_reference(seq_len, block, kv_heads):
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(seq_len)
    q, k, v = qkv(gen, 4, seq_len, 4, 16, kv_heads)
    split = random_splits(gen, 4, seq_len)
    bm = flex_split_block_mask(split, seq_len, block_size=block)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uncompiled flex_attention warns about speed on CPU
        got = flex_attention(q, k, v, block_mask=bm, enable_gqa=kv_heads != 4)
    torch.testing.assert_close(got, reference_attention(q, k, v, split), rtol=1e-5, atol=1e-5)


def test_varlen_lengths_describe_the_two_calls():
    split = torch.tensor([0, 3, 5, 2])
    v = varlen_split_lengths(split, 5)
    assert v.prefix_cu_seqlens.tolist() == [0, 0, 3, 8, 10]
    assert v.suffix_cu_seqlens_q.tolist() == [0, 5, 7, 7, 10]
    assert v.suffix_cu_seqlens_k.tolist() == [0, 5, 10, 15, 20]
    assert (v.prefix_max_seqlen, v.suffix_max_seqlen_q, v.suffix_max_seqlen_k) == (5, 5, 5)
    assert v.prefix_cu_seqlens.dtype == torch.int32
    # every row is exactly one of prefix/suffix, and the prefix rows are the rows t < split
    rows = torch.cat([v.prefix_index, v.suffix_index]).sort().values
    assert torch.equal(rows, torch.arange(20))
    assert all(int(r) % 5 < int(split[int(r) // 5]) for r in v.prefix_index)


def varlen_allowed(v, seq_len):
    """Rebuild allowed(q,k) from the varlen description alone (which key rows each query sees)."""
    b = v.batch_size
    allowed = torch.zeros(b, seq_len, seq_len, dtype=torch.bool)
    for index, cu_q, kv_rows, cu_k in (
        (v.prefix_index, v.prefix_cu_seqlens, v.prefix_index, v.prefix_cu_seqlens),
        (v.suffix_index, v.suffix_cu_seqlens_q, v.kv_index, v.suffix_cu_seqlens_k),
    ):
        for seg in range(b):
            qs = index[cu_q[seg]:cu_q[seg + 1]]
            ks = kv_rows[cu_k[seg]:cu_k[seg + 1]]
            for qr in qs.tolist():
                for kr in ks.tolist():
                    assert qr // seq_len == kr // seq_len == seg, "segment mixes samples"
                    allowed[seg, qr % seq_len, kr % seq_len] = True
    return allowed


@pytest.mark.parametrize("seq_len", [1, 9, 24])
def test_varlen_description_matches_brute_force(seq_len):
    gen = torch.Generator().manual_seed(seq_len + 100)
    for _ in range(4):
        split = random_splits(gen, 5, seq_len)
        v = varlen_split_lengths(split, seq_len)
        assert torch.equal(~varlen_allowed(v, seq_len), brute_force_masked_out(split, seq_len)[:, 0])


def test_varlen_with_padding_matches_brute_force_on_valid_rows():
    gen = torch.Generator().manual_seed(7)
    seq_len = 15
    valid = torch.randint(1, seq_len + 1, (6,), generator=gen)
    split = (torch.rand(6, generator=gen) * (valid + 1)).long().clamp(max=valid)
    v = varlen_split_lengths(split, seq_len, valid_lengths=valid)
    expected = ~brute_force_masked_out(split, seq_len, valid)[:, 0]
    rows_valid = torch.arange(seq_len).view(1, -1, 1) < valid.view(-1, 1, 1)
    assert torch.equal(varlen_allowed(v, seq_len), expected & rows_valid)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_two_call_varlen_attention_equals_dense_reference(kv_heads):
    gen = torch.Generator().manual_seed(kv_heads)
    b, s, h, d = 5, 29, 4, 8
    q, k, v = qkv(gen, b, s, h, d, kv_heads)
    split = random_splits(gen, b, s)
    desc = varlen_split_lengths(split, s)
    got = split_varlen_attention(*(t.transpose(1, 2) for t in (q, k, v)), desc, sdpa_varlen_attention)
    torch.testing.assert_close(got.transpose(1, 2), reference_attention(q, k, v, split), rtol=1e-5, atol=1e-5)


def test_two_call_varlen_attention_with_padding_zeroes_pad_rows():
    gen = torch.Generator().manual_seed(3)
    b, s, h, d = 3, 16, 2, 8
    q, k, v = qkv(gen, b, s, h, d)
    valid = torch.tensor([16, 9, 4])
    split = torch.tensor([5, 9, 1])
    desc = varlen_split_lengths(split, s, valid_lengths=valid)
    got = split_varlen_attention(*(t.transpose(1, 2) for t in (q, k, v)), desc).transpose(1, 2)
    ref = reference_attention(q, k, v, split, valid)
    for i in range(b):
        n = int(valid[i])
        torch.testing.assert_close(got[i, :, :n], ref[i, :, :n], rtol=1e-5, atol=1e-5)
        assert torch.count_nonzero(got[i, :, n:]) == 0


def test_split_for_variant_rule():
    """Only biglm restricts attention; the others carry split 0, which the rule makes full."""
    split = torch.tensor([3])
    assert restricts_attention("biglm") and attention_split(split, "biglm") is split
    for variant in ("no_attn", "mlm"):
        assert not restricts_attention(variant)
        assert torch.equal(attention_split(split, variant), torch.tensor([0]))
        assert attention_split(3, variant) == 0
        assert not dense_split_mask(attention_split(split, variant), 8).any()
    with pytest.raises(ValueError, match="unknown objective variant"):
        attention_split(split, "bogus")


@pytest.mark.parametrize(
    "split,valid,match",
    [
        (torch.tensor([[1, 2]]), None, "1-D"),
        (torch.tensor([0.5]), None, "integer"),
        (torch.tensor([9]), None, r"\[0, valid length\]"),
        (torch.tensor([-1]), None, r"\[0, valid length\]"),
        (torch.tensor([3]), torch.tensor([2]), r"\[0, valid length\]"),
        (torch.tensor([1]), torch.tensor([9]), "valid_lengths must lie"),
    ],
)
def test_bad_split_gets_clear_error(split, valid, match):
    for build in (dense_split_mask, varlen_split_lengths):
        with pytest.raises((ValueError, TypeError), match=match):
            build(split, 8, valid_lengths=valid)


# --- analytic BlockMask (no s x s grid, no compile) vs torch's create_block_mask -----------

def random_flex_case(gen, max_b=4, max_s=160):
    """A random (split, seq_len, block_size, valid_lengths), often with s % block != 0."""
    b = int(torch.randint(1, max_b + 1, (1,), generator=gen))
    s = int(torch.randint(1, max_s + 1, (1,), generator=gen))
    block = int(torch.randint(1, 48, (1,), generator=gen))
    if torch.rand(1, generator=gen) < 0.25:  # distinct q / kv block sizes
        block = (block, int(torch.randint(1, 48, (1,), generator=gen)))
    valid = torch.randint(1, s + 1, (b,), generator=gen) if torch.rand(1, generator=gen) < 0.5 else None
    limit = valid if valid is not None else torch.full((b,), s)
    split = (torch.rand(b, generator=gen) * (limit + 1)).long().clamp(max=limit)
    if b >= 2 and torch.rand(1, generator=gen) < 0.3:
        split[0], split[1] = 0, limit[1]  # degenerate cuts
    return split, s, block, valid


def listed_blocks(num, idx):
    """Per row, the set of block indices a BlockMask list keeps (kernels read only the first num)."""
    return [sorted(r[:n].tolist()) for r, n in zip(idx.reshape(-1, idx.shape[-1]), num.reshape(-1))]


def test_analytic_block_mask_equals_create_block_mask_over_random_draws():
    gen = torch.Generator().manual_seed(2024)
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
             "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
    n_tail = 0
    for _ in range(80):
        split, s, block, valid = random_flex_case(gen, max_s=130)
        got = flex_split_block_mask(split, s, block_size=block, valid_lengths=valid)
        ref = flex_split_block_mask(split, s, block_size=block, valid_lengths=valid, method="create")
        case = f"split={split.tolist()} s={s} block={block} valid={valid}"
        assert torch.equal(got.to_dense(), ref.to_dense()), case
        assert got.shape == ref.shape and got.seq_lengths == ref.seq_lengths == (s, s), case
        assert tuple(got.BLOCK_SIZE) == tuple(ref.BLOCK_SIZE), case
        for num, idx in zip(names[0::2], names[1::2]):
            g_num, r_num = getattr(got, num), getattr(ref, num)
            assert g_num.dtype == r_num.dtype == torch.int32 and torch.equal(g_num, r_num), (num, case)
            assert getattr(got, idx).shape == getattr(ref, idx).shape, (idx, case)
            assert listed_blocks(g_num, getattr(got, idx)) == listed_blocks(r_num, getattr(ref, idx)), (idx, case)
        n_tail += s % (block if isinstance(block, int) else block[0]) != 0
    assert n_tail > 30, "draws must cover seq_len not a multiple of the block size"


def test_analytic_block_mask_marks_full_and_partial_blocks_by_the_rule():
    """Independent of torch: full blocks are all-allowed tiles, partial ones mixed, the rest empty."""
    gen = torch.Generator().manual_seed(5)
    for _ in range(25):
        split, s, block, valid = random_flex_case(gen, max_s=60)
        q_bs, kv_bs = (block, block) if isinstance(block, int) else block
        bm = flex_split_block_mask(split, s, block_size=block, valid_lengths=valid)
        allowed = ~brute_force_masked_out(split, s, valid)[:, 0]
        nq, nk = -(-s // q_bs), -(-s // kv_bs)
        padded = torch.zeros(len(split), nq * q_bs, nk * kv_bs, dtype=torch.bool)
        padded[:, :s, :s] = allowed  # positions past seq_len count as not allowed
        tiles = padded.view(len(split), nq, q_bs, nk, kv_bs)
        full = tiles.all(dim=(2, 4))
        any_ = tiles.any(dim=(2, 4))
        from torch.nn.attention.flex_attention import _ordered_to_dense

        got_full = _ordered_to_dense(bm.full_kv_num_blocks, bm.full_kv_indices, nk)[:, 0].bool()
        got_partial = _ordered_to_dense(bm.kv_num_blocks, bm.kv_indices, nk)[:, 0].bool()
        assert torch.equal(got_full, full)
        assert torch.equal(got_partial, any_ & ~full)


def test_flex_attention_with_analytic_mask_equals_dense_sdpa():
    from torch.nn.attention.flex_attention import flex_attention

    gen = torch.Generator().manual_seed(11)
    for trial in range(8):
        split, s, block, valid = random_flex_case(gen, max_b=3, max_s=96)
        kv_heads = 2 if trial % 2 else 4
        q, k, v = qkv(gen, len(split), s, 4, 8, kv_heads)
        bm = flex_split_block_mask(split, s, block_size=block, valid_lengths=valid)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # uncompiled flex_attention warns about speed on CPU
            got = flex_attention(q, k, v, block_mask=bm, enable_gqa=kv_heads != 4)
        torch.testing.assert_close(got, reference_attention(q, k, v, split, valid), rtol=1e-5, atol=1e-5)


class LargestTensorProbe:
    """Records the largest tensor (numel) any aten op produces inside the context.

    Sees every allocation torch makes on behalf of the build, which tracemalloc cannot.
    """

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        probe = self
        probe.largest = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                sizes = [t.numel() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                probe.largest = max([probe.largest, *sizes])
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)


def test_analytic_build_allocates_no_s_by_s_tensor():
    b, s, block = 2, 8192, 128
    split = torch.tensor([1000, 6000])
    # the probe does see the dense grid of the eager create_block_mask (checked at a small s)
    with LargestTensorProbe() as probe:
        flex_split_block_mask(torch.tensor([100, 300]), 512, block_size=block, method="create")
    assert probe.largest >= 2 * 512 * 512
    with LargestTensorProbe() as probe:
        bm = flex_split_block_mask(split, s, block_size=block, valid_lengths=torch.tensor([8000, s]))
    n_blocks = s // block
    assert probe.largest <= b * n_blocks * n_blocks, probe.largest  # vs s * s = 67M
    held = [t for t in bm.as_tuple() if isinstance(t, torch.Tensor)]
    assert len(held) == 8 and max(t.numel() for t in held) <= b * n_blocks * n_blocks


def test_flex_block_mask_bad_method_or_compile_gets_clear_error():
    split = torch.tensor([3])
    with pytest.raises(ValueError, match="unknown BlockMask build method"):
        flex_split_block_mask(split, 8, method="dense")
    with pytest.raises(ValueError, match="method='create' only"):
        flex_split_block_mask(split, 8, compile=True)
    with pytest.raises(ValueError, match="block_size must be positive"):
        flex_split_block_mask(split, 8, block_size=0)
    with pytest.raises(ValueError, match=r"\[0, valid length\]"):
        flex_split_block_mask(torch.tensor([9]), 8)
