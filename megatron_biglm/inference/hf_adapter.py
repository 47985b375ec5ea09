"""Adapter over any HF `AutoModelForMaskedLM` (BERT, RoBERTa, EuroBERT, our BiGLM export).

HF masked LMs know nothing of BiGLM's split, so what runs is decided by probes at load time
(a few forwards on random ids) and recorded in the results (`describe()`):
- split attention: a model whose forward takes `split=` uses it ("native"); otherwise an
  additive 4D mask `[b, 1, s, s]` is tried ("4d-mask": BERT, RoBERTa and EuroBERT/BiGLM accept
  it in transformers 5). The probe checks that the 4D mask means what we think (an all-visible
  4D mask equals the 2D padding mask) and that prefix logits do not move when the suffix
  changes. A model that fails runs full attention ("none"): context rows then also see the
  masked continuation, so `beam` is not the reference rule there.
- prefix cache: the prefix's keys/values are collected by passing an empty `DynamicCache`
  through the encoder; suffix-only forwards then attend to them with a 4D mask and explicit
  position ids (RoBERTa-style ids that start at `pad_token_id + 1` are detected). The probe
  compares that path with the full forward; a mismatch or an error turns it off.
- head at positions: if the LM head is a submodule (`lm_head`, `cls`, `predictions`) that
  reproduces the full forward, logits are computed only where the rules read them.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.model.attention_masks import (
    additive_mask,
    block_causal_mask,
    sequence_mask,
    suffix_after_prefix_mask,
)
from megatron_biglm.model.kv_cache import append_right_padded

from .protocol import MaskedLMAdapter

_CHOICES = ("auto", "on", "off")


@dataclass
class _PrefixState:
    layers: list[tuple[torch.Tensor, torch.Tensor]]
    lengths: torch.Tensor
    width: int


class HFMaskedLMAdapter(MaskedLMAdapter):
    """`split_attention` / `prefix_cache`: "auto" (use when the probe passes), "on" (fail
    loudly if it does not), "off". `length_head`: the export's CMLM length head
    (`loading.load_length_head`), which adds `predict_lengths`."""

    def __init__(self, model, special: TokenIds, *, max_length: int | None = None,
                 split_attention: str = "auto", prefix_cache: str = "auto", length_head=None):
        for name, value in (("split_attention", split_attention), ("prefix_cache", prefix_cache)):
            if value not in _CHOICES:
                raise ValueError(f"{name} must be one of {_CHOICES}, got {value!r}")
        self.model = model.eval()
        self.special = special
        self.max_length = int(max_length or getattr(model.config, "max_position_embeddings", 512))
        self.embedding_rows = _embedding_rows(model)
        self._dtype = next(model.parameters()).dtype
        self._position_offset = 0
        self._max_position_id = int(getattr(model.config, "max_position_embeddings", 1 << 30)) - 1
        self._head = self._resolve_head()
        self._cache_arg: str | None = None   # decided at the first cached forward
        self.split_mode, self.split_note = self._resolve_split(split_attention)
        self.split_attention = self.split_mode != "none"
        self.prefix_cache, self.cache_note = self._resolve_cache(prefix_cache)
        self.length_head = length_head
        if length_head is not None:  # from the export's length_head.safetensors (loading.load_length_head)
            self.predict_lengths = self._predict_lengths

    def _predict_lengths(self, prefix_ids, prefix_lengths, k: int):
        """`LengthPrediction`: the length head's top-k target lengths `[g, k]` (best first,
        >= 1) and their log-probabilities, from the mean of the prefix's final hidden states
        (prefix rows see the prefix only: full attention)."""
        base = getattr(self.model, "base_model", None)
        if not isinstance(base, torch.nn.Module) or base is self.model:
            raise ValueError(f"{type(self.model).__name__} has no base model to read hidden states from")
        padding = (torch.arange(prefix_ids.shape[1], device=prefix_ids.device)[None]
                   < prefix_lengths[:, None]).long()
        with torch.no_grad():
            hidden = base(input_ids=prefix_ids, attention_mask=padding)[0]  # [g, p, h], after the norm
            logits = self.length_head(None, hidden.transpose(0, 1), prefix_lengths=prefix_lengths)
        return self.length_head.predict(logits, k)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ---------------------------------------------------------------- forward paths
    @torch.no_grad()
    def logits(self, input_ids, lengths, split, positions):
        s = input_ids.shape[1]
        padding = (torch.arange(s, device=input_ids.device)[None] < lengths[:, None]).long()
        if split is None or self.split_mode == "none":
            return self._run(positions, input_ids=input_ids, attention_mask=padding)
        if self.split_mode == "native":
            out = self.model(input_ids=input_ids, attention_mask=padding, split=split).logits
            return _gather(out, positions)
        mask = additive_mask(sequence_mask(lengths, s, split), self._dtype)
        return self._run(positions, input_ids=input_ids, attention_mask=mask)

    @torch.no_grad()
    def block_causal_logits(self, input_ids, lengths, starts, positions):
        """`BlockCausalLogits`: the block-causal pattern as an additive 4D mask."""
        if self.split_mode != "4d-mask":
            raise ValueError(f"block-causal attention needs a 4D attention mask; this "
                             f"{type(self.model).__name__} runs split mode {self.split_mode!r}")
        mask = additive_mask(block_causal_mask(lengths, input_ids.shape[1], starts), self._dtype)
        return self._run(positions, input_ids=input_ids, attention_mask=mask)

    def _run(self, positions, cache=None, **inputs) -> torch.Tensor:
        """Logits at `positions` only. With a verified head (see `_resolve_head`) the LM head
        runs on the gathered hidden states: a full `[b, s, V]` logits tensor is 6 GB for
        16 x 2048 tokens and a 49k vocabulary."""
        if self._head is None:
            return _gather(self.model(**inputs, **self._cache(cache)).logits, positions)
        hidden = self.model.base_model(**inputs, **self._cache(cache))[0]
        return self._head(_gather(hidden, positions))

    def _cache(self, cache) -> dict:
        if cache is None:
            return {}
        if self._cache_arg is None:
            self._cache_arg = cache_argument_name(self.model.base_model, self.device)
        return {self._cache_arg: cache}

    @torch.no_grad()
    def encode_prefix(self, prefix_ids, prefix_lengths):
        from transformers import DynamicCache  # lazy: start-up (transformers: 0.7 CPU s)

        cache = DynamicCache()
        width = prefix_ids.shape[1]
        attention = (torch.arange(width, device=prefix_ids.device)[None] < prefix_lengths[:, None]).long()
        self.model.base_model(input_ids=prefix_ids, attention_mask=attention,
                              **self._cache(cache))
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        if not layers:
            raise RuntimeError(f"{type(self.model).__name__} did not fill the key/value cache")
        return _PrefixState(layers, prefix_lengths, width)

    @torch.no_grad()
    def logits_with_prefix(self, state: _PrefixState, rows, suffix_ids, suffix_lengths, positions):
        cache, inputs = self._after_prefix(state, rows, suffix_ids, suffix_lengths)
        return self._run(positions, cache=cache, **inputs)

    @torch.no_grad()
    def extend_prefix(self, state: _PrefixState, rows, block_ids, block_lengths):
        rows = rows.to(state.lengths.device, non_blocking=True)
        cache, inputs = self._after_prefix(state, rows, block_ids, block_lengths)
        self.model.base_model(**inputs, **self._cache(cache))
        old_lengths = state.lengths.index_select(0, rows)
        layers = []
        for layer in cache.layers:  # [b, heads, w + q, d]: the selected rows, then the block
            grown = [append_right_padded(t[:, :, :state.width], old_lengths, t[:, :, state.width:],
                                         block_lengths, seq_dim=2, batch_dim=0)
                     for t in (layer.keys, layer.values)]
            layers.append((grown[0], grown[1]))
        lengths = old_lengths + block_lengths
        return _PrefixState(layers, lengths, int(layers[0][0].shape[2]))

    def _after_prefix(self, state: _PrefixState, rows, ids, lengths):
        """A cache holding the prefixes of `rows`, and the inputs that run rows `ids [b, q]`
        after them: each row sees every real cached key and every real key of `ids`."""
        from transformers import DynamicCache  # lazy: start-up (transformers: 0.7 CPU s)

        rows = rows.to(state.lengths.device, non_blocking=True)
        cache = DynamicCache()
        for index, (keys, values) in enumerate(state.layers):
            cache.update(keys.index_select(0, rows), values.index_select(0, rows), index)
        prefix_lengths = state.lengths.index_select(0, rows)
        q = ids.shape[1]
        allowed = suffix_after_prefix_mask(prefix_lengths, state.width, lengths, q)
        position_ids = (self._position_offset + prefix_lengths[:, None]
                        + torch.arange(q, device=ids.device)[None])
        # padding slots of short rows may run past the table; their outputs are never read
        position_ids = position_ids.clamp(max=self._max_position_id)
        return cache, {"input_ids": ids, "attention_mask": additive_mask(allowed, self._dtype),
                       "position_ids": position_ids}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "split_mode": self.split_mode, "split_note": self.split_note,
                "prefix_cache_note": self.cache_note, "model_class": type(self.model).__name__,
                "logits_at_positions_only": self._head is not None}

    # ---------------------------------------------------------------- probes
    def _resolve_head(self):
        """The LM head as a module that maps the base model's hidden states to logits, if
        one of the usual names (`lm_head`: RoBERTa, EuroBERT; `cls`: BERT; `predictions`:
        ALBERT) reproduces the full forward exactly; else None (full logits)."""
        base = getattr(self.model, "base_model", None)
        if not isinstance(base, torch.nn.Module) or base is self.model:
            return None
        ids, _, lengths, _ = self._probe_inputs()
        padding = (torch.arange(ids.shape[1], device=ids.device)[None] < lengths[:, None]).long()
        positions = torch.tensor([[0, 5, 11], [1, 2, 8], [0, 3, 6]], device=ids.device)
        for name in ("lm_head", "cls", "predictions"):
            head = getattr(self.model, name, None)
            if not isinstance(head, torch.nn.Module):
                continue
            try:
                with torch.inference_mode():
                    want = _gather(self.model(input_ids=ids, attention_mask=padding).logits, positions)
                    hidden = base(input_ids=ids, attention_mask=padding)[0]
                    got = head(_gather(hidden, positions))
            except Exception:  # noqa: BLE001 - not this name's layout; try the next
                continue
            if got.shape == want.shape and _close(got, want):
                return head
        return None

    def _resolve_split(self, wanted: str) -> tuple[str, str]:
        if wanted == "off":
            return "none", "split attention turned off by the user: full attention"
        if "split" in inspect.signature(self.model.forward).parameters:
            return "native", "the model's forward takes split="
        ok, why = self._probe_split()
        if ok:
            return "4d-mask", "split applied with an additive 4D attention mask (probe passed)"
        if wanted == "on":
            raise ValueError(f"{type(self.model).__name__} cannot apply a split attention mask "
                             f"({why}); pass split_attention=off to evaluate with full attention")
        return "none", f"full attention: the model does not honour a 4D split mask ({why})"

    def _resolve_cache(self, wanted: str) -> tuple[bool, str]:
        if wanted == "off":
            return False, "prefix cache turned off by the user"
        if self.split_mode != "4d-mask":
            why = "prefix reuse needs split attention through a 4D mask"
            if wanted == "on":
                raise ValueError(f"prefix_cache=on impossible: {why} (split mode: {self.split_mode})")
            return False, why
        ok, why = self._probe_cache()
        if not ok and wanted == "on":
            raise ValueError(f"prefix_cache=on impossible for {type(self.model).__name__}: {why}")
        return ok, ("prefix keys/values reused (probe passed)" if ok else why)

    def _probe_inputs(self):
        gen = torch.Generator().manual_seed(1234)
        vocab = int(self.model.config.vocab_size)
        ids = torch.randint(0, vocab, (3, 12), generator=gen)
        lengths = torch.tensor([12, 9, 7])
        split = torch.tensor([7, 5, 1])
        other = ids.clone()
        for r in range(3):
            other[r, split[r]:] = torch.randint(0, vocab, (12 - int(split[r]),), generator=gen)
        dev = self.device
        return ids.to(dev), other.to(dev), lengths.to(dev), split.to(dev)

    def _probe_split(self) -> tuple[bool, str]:
        ids, other, lengths, split = self._probe_inputs()
        pos = torch.arange(12, device=ids.device)[None].expand(3, -1)
        try:
            with torch.inference_mode():
                padding = (pos < lengths[:, None]).long()
                plain = self.model(input_ids=ids, attention_mask=padding).logits
                full4d = self.model(input_ids=ids, attention_mask=additive_mask(
                    sequence_mask(lengths, 12, None), self._dtype)).logits
                mask = additive_mask(sequence_mask(lengths, 12, split), self._dtype)
                a = self.model(input_ids=ids, attention_mask=mask).logits
                b = self.model(input_ids=other, attention_mask=mask).logits
        except Exception as exc:  # noqa: BLE001 - any failure means "not supported", reported
            return False, f"4D mask raised {type(exc).__name__}: {exc}"[:300]
        valid = pos < lengths[:, None]
        prefix = pos < split[:, None]
        if not _close(plain[valid], full4d[valid]):
            return False, "an all-visible 4D mask changed the logits"
        if not _close(a[prefix], b[prefix]):
            return False, "prefix logits changed when only the suffix changed"
        return True, ""

    def _probe_cache(self) -> tuple[bool, str]:
        """Cached path vs full forward. Position ids of the suffix are tried as `prefix length
        + i` and, for RoBERTa-style embeddings that count from `pad_token_id + 1`, shifted by
        that offset; the first that matches is kept."""
        offsets = [0]
        pad = getattr(self.model.config, "pad_token_id", None)
        if isinstance(pad, int):
            offsets.append(pad + 1)
        why = ""
        for offset in offsets:
            self._position_offset = offset
            ok, why = self._compare_cached_with_full()
            if ok:
                return True, ""
        self._position_offset = 0
        return False, why

    def _compare_cached_with_full(self) -> tuple[bool, str]:
        ids, _, lengths, split = self._probe_inputs()
        try:
            with torch.inference_mode():
                width = int(split.max())
                prefix = ids[:, :width].clone()
                state = self.encode_prefix(prefix, split)
                suffix_lengths = lengths - split
                q = int(suffix_lengths.max())
                suffix = torch.full((3, q), self.special.pad_id, dtype=torch.long, device=ids.device)
                for r in range(3):
                    suffix[r, :suffix_lengths[r]] = ids[r, split[r]:lengths[r]]
                positions = torch.arange(q, device=ids.device)[None].expand(3, -1)
                rows = torch.tensor([2, 0, 1], device=ids.device)  # reorder rows on purpose
                cached = self.logits_with_prefix(state, rows, suffix[rows], suffix_lengths[rows],
                                                 positions)
                full = self.logits(ids[rows], lengths[rows], split[rows],
                                   (positions + split[rows, None]).clamp(max=11))
        except Exception as exc:  # noqa: BLE001 - any failure means "not supported", reported
            return False, f"prefix cache raised {type(exc).__name__}: {exc}"[:300]
        valid = positions < suffix_lengths[rows, None]
        if not _close(cached[valid], full[valid]):
            return False, "cached-prefix logits differ from the full forward"
        return True, ""


def _embedding_rows(model) -> int | None:
    """The rows of a transformers model's input embedding; None for another module (a wrapper
    whose forward calls one), which does not say."""
    from transformers import PreTrainedModel  # lazy: start-up (transformers: 0.7 CPU s)

    if not isinstance(model, PreTrainedModel):
        return None
    return int(model.get_input_embeddings().num_embeddings)


def _gather(logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))


_PROBE_TOLERANCE = {torch.float64: 1e-7, torch.float32: 1e-4}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the dtype's rounding (half precision: 3e-2), relative to the logit scale."""
    tol = _PROBE_TOLERANCE.get(a.dtype, 3e-2)
    a, b = a.double(), b.double()
    scale = 1.0 + a.abs().max().item() if a.numel() else 1.0
    return bool(torch.allclose(a, b, atol=tol * scale, rtol=0.0))


def cache_argument_name(base_model, device) -> str:
    """The keyword this model's forward takes a K/V cache by: transformers' current `cache`
    where the installed release renamed it (it then warns that `past_key_values` goes away in
    5.40), else `past_key_values`. Decided by one two-token forward at load: the rename hides
    behind `**kwargs` in the forward's signature."""
    from transformers import DynamicCache  # lazy: start-up (transformers: 0.7 CPU s)

    ids = torch.zeros(1, 2, dtype=torch.long, device=device)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        try:
            base_model(input_ids=ids, past_key_values=DynamicCache())
        except Exception:  # noqa: BLE001 - a model without any cache: the probes say so later
            return "past_key_values"
    renamed = any("past_key_values" in str(w.message) and "`cache`" in str(w.message) for w in caught)
    return "cache" if renamed else "past_key_values"
