"""The exact prefix K/V cache of the inference adapters (megatron and HF), and `extend_prefix`.

References are full forwards with an explicit dense mask, never the cache itself:
- `logits_with_prefix` after `encode_prefix(P)` equals the split-attention forward of P + S;
- after `extend_prefix` by blocks B1, B2 the state's keys/values equal those of a fresh forward
  of P + B1 + B2 under the block-causal pattern (rows of P see P, rows of B1 see P + B1, rows
  of B2 see P + B1 + B2), and a suffix scored against it equals that forward over P + B1 + B2 + S.
All in fp32 on random prefixes, blocks and suffixes of different lengths (right padding), with
cached rows selected out of order and repeated. Tolerance 1e-5.
"""
from __future__ import annotations

import pytest
import torch
from eval_fixtures import one_torch_thread, tiny_bert, tiny_biglm  # noqa: F401
from model_fixtures import build_model, init_megatron, spread_weights, tiny_config

from megatron_biglm.model.attention_masks import additive_mask
from megatron_biglm.evaluation.runner import score_requests
from megatron_biglm.evaluation.scoring import ScoreRequest, make_rule
from megatron_biglm.inference import TokenIds
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter
from megatron_biglm.model.attention_params import BiGLMAttentionParams
from megatron_biglm.model.core_attention import kv_ports_attached
from megatron_biglm.model.kv_cache import KVCacheForward, append_right_padded

TOL = 1e-5
VOCAB = 200
SPECIAL = TokenIds(bos_id=1, mask_id=3, pad_id=0, eos_id=2)


# ------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def megatron_adapter():
    init_megatron(1, 1)
    model = spread_weights(build_model(tiny_config(vocab_size=VOCAB), seed=4), 0.15)
    return MegatronMaskedLMAdapter(model, SPECIAL, vocab_size=VOCAB, max_length=128)


def _hf_adapter(kind: str) -> HFMaskedLMAdapter:
    model = tiny_biglm(VOCAB, SPECIAL, seed=2) if kind == "biglm" else tiny_bert(VOCAB, seed=2)
    if kind == "bert":
        with torch.no_grad():  # BERT's init is tiny too: logits O(1..10) like the others
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.2)
    adapter = HFMaskedLMAdapter(model, SPECIAL, prefix_cache="on")
    assert adapter.prefix_cache
    return adapter


@pytest.fixture(scope="module", params=["megatron", "hf-biglm", "hf-bert"])
def adapter(request):
    if request.param == "megatron":
        return request.getfixturevalue("megatron_adapter")
    return _hf_adapter(request.param.split("-")[1])


# ------------------------------------------------------------------------- helpers
def _segments(g: torch.Generator, n: int, lo: int, hi: int) -> list[list[int]]:
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [torch.randint(4, VOCAB, (k,), generator=g).tolist() for k in lengths]


def _pad(seqs) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), SPECIAL.pad_id, dtype=torch.long)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
    return ids, torch.tensor([len(s) for s in seqs])


def _block_causal(parts: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows `parts[0][r] + parts[1][r] + ...`, right padded: ids [b, s], lengths [b] and the
    allowed mask [b, s, s] (a query of segment k sees real keys of segments <= k)."""
    rows = [sum((p[r] for p in parts), []) for r in range(len(parts[0]))]
    ids, lengths = _pad(rows)
    s = ids.shape[1]
    segment = torch.full((len(rows), s), len(parts), dtype=torch.long)
    for r in range(len(rows)):
        start = 0
        for k, p in enumerate(parts):
            segment[r, start:start + len(p[r])] = k
            start += len(p[r])
    valid = torch.arange(s)[None] < lengths[:, None]
    allowed = valid[:, None, :] & (segment[:, None, :] <= segment[:, :, None])
    return ids, lengths, allowed


def _positions(g: torch.Generator, lengths: torch.Tensor, k: int = 3) -> torch.Tensor:
    return torch.stack([torch.randint(0, int(n), (k,), generator=g) for n in lengths])


def _megatron_dense(adapter: MegatronMaskedLMAdapter, ids, allowed):
    """Reference: the model's own layers under an explicit dense mask; returns the final hidden
    states [b, s, h] and the recorded per-layer keys/values [s, b, ng, d]."""
    model = adapter.model
    emb, rotary = model._preprocess(input_ids=ids, position_ids=None)[:2]
    record = KVCacheForward()
    params = BiGLMAttentionParams(backend="sdpa", derived=allowed[:, None])
    layers = model.decoder.layers
    with torch.no_grad(), kv_ports_attached(layers, record.layer_ports(len(layers), ids.shape[1])):
        hidden = model.decoder(hidden_states=emb, attention_mask=None, rotary_pos_emb=rotary,
                               packed_seq_params=params)
    return hidden.transpose(0, 1), record.recorded(allowed[:, 0].sum(-1))  # lengths unused


def _reference_logits(adapter, ids, lengths, allowed, positions):
    if isinstance(adapter, MegatronMaskedLMAdapter):
        hidden, _ = _megatron_dense(adapter, ids, allowed)
        return adapter._head(hidden, positions)
    with torch.no_grad():
        return adapter._run(positions, input_ids=ids,
                            attention_mask=additive_mask(allowed, adapter._dtype))


def _reference_kv(adapter, ids, allowed) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) of the reference forward, as [b, s, ...] (row first)."""
    if isinstance(adapter, MegatronMaskedLMAdapter):
        _, kv = _megatron_dense(adapter, ids, allowed)
        return [(k.transpose(0, 1), v.transpose(0, 1)) for k, v in zip(kv.keys, kv.values)]
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        adapter.model.base_model(input_ids=ids, attention_mask=additive_mask(allowed, adapter._dtype),
                                 past_key_values=cache)
    return [(layer.keys.transpose(1, 2), layer.values.transpose(1, 2)) for layer in cache.layers]


def _state_kv(adapter, state) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    if isinstance(adapter, MegatronMaskedLMAdapter):
        return [(k.transpose(0, 1), v.transpose(0, 1)) for k, v in zip(state.keys, state.values)], state.lengths
    return [(k.transpose(1, 2), v.transpose(1, 2)) for k, v in state.layers], state.lengths


def _assert_close(got, want, what):
    scale = 1.0 + want.abs().max().item()
    err = (got - want).abs().max().item()
    assert err <= TOL * scale, f"{what}: max error {err:.3g} (scale {scale:.3g})"


# ------------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_suffix_logits_equal_the_split_forward(adapter, seed):
    g = torch.Generator().manual_seed(seed)
    prefixes = _segments(g, 4, 1, 20)
    rows = torch.tensor([2, 0, 3, 3, 1, 0])  # out of order, repeated
    suffixes = _segments(g, len(rows), 1, 9)
    state = adapter.encode_prefix(*_pad(prefixes))
    suffix_ids, suffix_lengths = _pad(suffixes)
    positions = _positions(g, suffix_lengths)
    got = adapter.logits_with_prefix(state, rows, suffix_ids, suffix_lengths, positions)
    full = [prefixes[r] + s for r, s in zip(rows.tolist(), suffixes)]
    ids, lengths = _pad(full)
    split = torch.tensor([len(prefixes[r]) for r in rows.tolist()])
    want = adapter.logits(ids, lengths, split, positions + split[:, None])
    assert want.abs().max() > 1.0, "logits too flat to test anything"
    _assert_close(got, want, "cached vs split forward")


@pytest.mark.parametrize("seed", [0, 1])
def test_extend_prefix_equals_a_fresh_block_causal_encoding(adapter, seed):
    g = torch.Generator().manual_seed(10 + seed)
    prefixes = _segments(g, 3, 1, 12)
    state = adapter.encode_prefix(*_pad(prefixes))
    rows1 = torch.tensor([1, 2, 0, 1])  # the second and fourth rows share a prefix
    block1 = _segments(g, 4, 1, 6)
    state1 = adapter.extend_prefix(state, rows1, *_pad(block1))
    rows2 = torch.tensor([3, 0, 2])
    block2 = _segments(g, 3, 1, 6)
    state2 = adapter.extend_prefix(state1, rows2, *_pad(block2))
    # the row-by-row content of state2, as segments
    p = [prefixes[rows1[r]] for r in rows2.tolist()]
    b1 = [block1[r] for r in rows2.tolist()]
    ids, lengths, allowed = _block_causal([p, b1, block2])

    want_kv = _reference_kv(adapter, ids, allowed)
    got_kv, got_lengths = _state_kv(adapter, state2)
    assert got_lengths.tolist() == lengths.tolist()
    assert len(got_kv) == len(want_kv)
    for layer, ((gk, gv), (wk, wv)) in enumerate(zip(got_kv, want_kv)):
        for r, n in enumerate(lengths.tolist()):
            _assert_close(gk[r, :n], wk[r, :n], f"layer {layer} row {r} keys")
            _assert_close(gv[r, :n], wv[r, :n], f"layer {layer} row {r} values")

    # a suffix scored against the grown cache sees prefix + both blocks
    rows3 = torch.tensor([2, 2, 0, 1])
    suffixes = _segments(g, 4, 1, 7)
    suffix_ids, suffix_lengths = _pad(suffixes)
    positions = _positions(g, suffix_lengths)
    got = adapter.logits_with_prefix(state2, rows3, suffix_ids, suffix_lengths, positions)
    parts = [[seg[r] for r in rows3.tolist()] for seg in (p, b1, block2)] + [suffixes]
    ids, lengths, allowed = _block_causal(parts)
    offset = torch.tensor([sum(len(x[r]) for x in parts[:3]) for r in range(4)])
    want = _reference_logits(adapter, ids, lengths, allowed, positions + offset[:, None])
    _assert_close(got, want, "suffix after two extensions")


def test_one_extension_equals_the_models_own_split_forward(megatron_adapter):
    """One block: block-causal over P + B is the training pattern with split = |P|, so the
    reference is the model's own split forward over P + B (its keys/values recorded)."""
    adapter = megatron_adapter
    g = torch.Generator().manual_seed(7)
    prefixes, blocks = _segments(g, 3, 2, 10), _segments(g, 3, 1, 5)
    state = adapter.extend_prefix(adapter.encode_prefix(*_pad(prefixes)), torch.arange(3),
                                  *_pad(blocks))
    ids, lengths = _pad([p + b for p, b in zip(prefixes, blocks)])
    split = torch.tensor([len(p) for p in prefixes])
    record = KVCacheForward()
    with torch.no_grad():
        adapter.model(ids, split=split, valid_lengths=lengths, return_hidden=True, kv_cache=record)
    want = record.recorded(lengths)
    assert state.lengths.tolist() == lengths.tolist()
    for layer, (gk, gv, wk, wv) in enumerate(zip(state.keys, state.values, want.keys, want.values)):
        for r, n in enumerate(lengths.tolist()):
            _assert_close(gk[:n, r], wk[:n, r], f"layer {layer} row {r} keys")
            _assert_close(gv[:n, r], wv[:n, r], f"layer {layer} row {r} values")
    # and prefix rows really are blind to the block: all-to-all P + B differs
    fresh = adapter.encode_prefix(ids, lengths)
    assert not torch.allclose(fresh.keys[-1][:2], state.keys[-1][:2])


def test_megatron_scoring_with_prefix_reuse_equals_without(megatron_adapter):
    g = torch.Generator().manual_seed(3)
    requests = []
    for ctx in _segments(g, 4, 0, 10):
        for cont in _segments(g, 3, 1, 4):
            requests.append(ScoreRequest((SPECIAL.bos_id, *ctx), tuple(cont)))
    assert megatron_adapter.prefix_cache and megatron_adapter.describe()["prefix_cache"]
    for rule in ("beam", "pll"):
        r = make_rule(rule, SPECIAL.mask_id, beam=2)
        a = score_requests(megatron_adapter, requests, r, batch_size=5, prefix_reuse=True)
        b = score_requests(megatron_adapter, requests, r, batch_size=5, prefix_reuse=False)
        assert [x.logprob for x in a] == pytest.approx([x.logprob for x in b], abs=1e-4)
        assert [x.is_greedy for x in a] == [x.is_greedy for x in b]


def test_no_cache_without_split_attention(megatron_adapter):
    plain = MegatronMaskedLMAdapter(megatron_adapter.model, SPECIAL, vocab_size=VOCAB,
                                    max_length=128, split_attention=False)
    assert not plain.prefix_cache
    with pytest.raises(NotImplementedError, match="split attention"):
        plain.encode_prefix(*_pad([[1, 5, 6]]))


def test_append_right_padded_in_both_layouts():
    past = torch.arange(2 * 4).reshape(2, 4).float()     # [b, w]
    new = 100 + torch.arange(2 * 3).reshape(2, 3).float()  # [b, q]
    pl, nl = torch.tensor([2, 4]), torch.tensor([3, 1])
    out = append_right_padded(past, pl, new, nl, seq_dim=1, batch_dim=0)
    assert out.shape == (2, 5)
    assert out[0].tolist() == [0, 1, 100, 101, 102]
    assert out[1, :5].tolist() == [4, 5, 6, 7, 103]
    # megatron layout [s, b, h]
    out_sb = append_right_padded(past.t()[..., None], pl, new.t()[..., None], nl, seq_dim=0, batch_dim=1)
    assert torch.equal(out_sb[..., 0].t(), out)


class _Tok:
    """A tokenizer-like object: BERT-style (CLS/SEP, no BOS/EOS) unless told otherwise."""

    def __init__(self, **ids):
        base = dict(mask_token_id=4, bos_token_id=None, cls_token_id=1, eos_token_id=None,
                    sep_token_id=2, pad_token_id=None, all_special_ids=[1, 2, 4])
        self.__dict__.update({**base, **ids})

    def __len__(self):
        return 50


def test_token_ids_fallback_rule():
    ids = TokenIds.from_tokenizer(_Tok())
    assert (ids.bos_id, ids.eos_id, ids.pad_id, ids.mask_id) == (1, 2, 2, 4)  # CLS, SEP, EOS
    assert ids.vocab_size == 50 and ids.special_ids == (1, 2, 4)
    bare = TokenIds.from_tokenizer(_Tok(cls_token_id=None, sep_token_id=None))
    assert (bare.bos_id, bare.eos_id, bare.pad_id) == (None, None, 4)  # PAD falls back to MASK
    with pytest.raises(ValueError, match="no bos_id"):
        bare.require("bos_id", why="inputs start with BOS")
    with pytest.raises(ValueError, match="no mask token"):
        TokenIds.from_tokenizer(_Tok(mask_token_id=None))
    with pytest.raises(ValueError, match="vocab_size"):
        TokenIds(mask_id=60, vocab_size=50)


def test_megatron_adapter_refuses_a_task_head_model_saying_what_it_holds():
    """A classification fine-tune has no masked-LM output: scoring or generating from it is
    refused when the adapter is built, with the head named (not a forward's keyword error)."""
    from megatron_biglm.model.head_model import head_model_provider

    init_megatron(1, 1)
    cfg = tiny_config(vocab_size=VOCAB)
    model = head_model_provider("classification", {"num_labels": 3})(True, True, cfg, cfg.to_transformer_config())
    with pytest.raises(ValueError, match="'classification' task head, not the masked-LM head"):
        MegatronMaskedLMAdapter(model, SPECIAL, vocab_size=VOCAB, max_length=128)


@pytest.mark.parametrize("kind", ["biglm", "bert"])
def test_hf_adapter_passes_the_cache_by_transformers_current_argument(kind):
    """No deprecation warning from the cached paths: the adapter passes its cache as `cache`
    where this transformers renamed `past_key_values` (it warns that the old name goes away),
    and the cached logits still equal the full forward's."""
    import warnings

    import transformers

    adapter = _hf_adapter(kind)
    g = torch.Generator().manual_seed(0)
    ids, lengths = torch.randint(4, VOCAB, (2, 6), generator=g), torch.tensor([6, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        state = adapter.encode_prefix(ids, lengths)
        rows = torch.tensor([1, 0])
        suffix, suffix_lengths = ids[:, :3], torch.tensor([3, 2])
        positions = torch.arange(3)[None].expand(2, -1)
        cached = adapter.logits_with_prefix(state, rows, suffix, suffix_lengths, positions)
        adapter.extend_prefix(state, rows, ids[:, :2], torch.tensor([2, 1]))
    prefix_lengths = lengths[rows]
    full_ids = torch.zeros(2, 9, dtype=torch.long)
    for i, r in enumerate(rows.tolist()):
        p, n = int(prefix_lengths[i]), int(suffix_lengths[i])
        full_ids[i, :p], full_ids[i, p:p + n] = ids[r, :p], suffix[i, :n]
    full = adapter.logits(full_ids, prefix_lengths + suffix_lengths, prefix_lengths,
                          (prefix_lengths[:, None] + positions).clamp(max=8))
    valid = positions < suffix_lengths[:, None]
    torch.testing.assert_close(cached[valid], full[valid], atol=1e-4, rtol=1e-4)
    if tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 24):
        assert adapter._cache_arg == "cache"
