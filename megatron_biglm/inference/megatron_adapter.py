"""Adapter over our megatron `BiGLMModel` run in-process (the `biglm` model on a megatron
checkpoint, or the live model inside training).

Why a dedicated adapter rather than `CallableMaskedLMAdapter`: BiGLMModel takes `split=` and
`valid_lengths=` natively (its attention builds the split mask itself, without a dense
`[b, s, s]` tensor), and its head is the tied embedding, so logits are computed only at the
positions the scoring rules read (`[b, k, V]` instead of `[b, s, V_padded]`).

Logits are sliced to the tokenizer's vocabulary: megatron pads the embedding to a multiple of
128 and those rows would otherwise take part in the softmax (the HF export drops them).

Exact prefix key/value reuse (`encode_prefix` / `logits_with_prefix` / `extend_prefix`)
through the model's `kv_cache` hook (`megatron_biglm.model.kv_cache`): the prefix's post-RoPE
keys/values are recorded per layer, and suffix (or block) rows run alone against them. Offered
at TP=1 only (the cache holds one rank's heads; TP>1 is untested) and with split attention.
`cache_layout`: "grow" (default) keeps each state's keys/values as tensors that every
extension re-gathers and concatenates; "pool" keeps them in a `model.kv_pool.KVSlotPool` of
per-request slots sized for `max_length`, written in place (a step reads nothing from the
device and builds no per-query mask), slots given back when a state is dropped.
`step_graphs` (pool layout, CUDA): each scoring step over consecutive slots is replayed from a
CUDA graph captured once per shape (`step_graphs.StepGraphs`).
A model with the CMLM length head (`model.length_head_max > 0`) also gets `predict_lengths`.
Pipeline parallelism is not supported here (one chunk must hold the whole model); tensor
parallelism works for `logits` when every TP rank calls the adapter (the head gathers the
vocabulary).
"""
from __future__ import annotations

import weakref

import torch
from megatron.core import parallel_state

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.model.head_model import BiGLMHeadModel
from megatron_biglm.model.kv_cache import KVCacheForward, PrefixKV
from megatron_biglm.model.kv_pool import KVSlotPool, PoolForward

from .protocol import MaskedLMAdapter, inference_token_ids
from .step_graphs import StepGraphs


class MegatronMaskedLMAdapter(MaskedLMAdapter):
    """`model`: a `BiGLMModel` holding embedding, all layers and the head (PP = 1).
    `vocab_size`: the tokenizer's vocabulary (logits past it are dropped).
    `split_attention=False` for models trained without the restriction (variants mlm/no_attn).
    `prefix_cache`: offer the exact prefix cache (only with split attention at TP=1)."""

    def __init__(self, model, special: TokenIds, *, vocab_size: int, max_length: int,
                 split_attention: bool = True, prefix_cache: bool = True, cache_layout: str = "grow",
                 step_graphs: bool = False):
        if isinstance(model, BiGLMHeadModel):
            raise ValueError(
                f"this checkpoint holds a model fine-tuned with a {model.head_name!r} task head, not the "
                "masked-LM head that scoring and generation need; use its pretraining checkpoint (or a "
                "verbalizer, seq2seq or instruction-tuned one), or evaluate it with its own task")
        if not (getattr(model, "pre_process", True) and getattr(model, "post_process", True)):
            raise ValueError("the megatron adapter needs the whole model in one chunk (PP=1); "
                             "load the checkpoint with pipeline_model_parallel_size=1")
        padded = int(model.shared_embedding_or_output_weight().shape[0]) * _tp_size()
        if not 0 < int(vocab_size) <= padded:
            raise ValueError(f"vocab_size {vocab_size} does not fit the model's {padded} "
                             "embedding rows: the tokenizer is not the model's")
        if cache_layout not in CACHE_LAYOUTS:
            raise ValueError(f"cache_layout must be one of {CACHE_LAYOUTS}, got {cache_layout!r}")
        self.cache_layout = cache_layout
        if step_graphs and cache_layout != "pool":
            raise ValueError("step_graphs replays steps over the slot pool: set cache_layout='pool'")
        self.step_graphs = bool(step_graphs)
        self._graphs = StepGraphs(self._pool_step) if step_graphs else None
        self._pool = None
        self.model = model.eval()
        self.special = special
        self.vocab_size = int(vocab_size)
        self.embedding_rows = self.vocab_size  # the rows past it are megatron's padding, no token's
        self.max_length = int(max_length)
        self.split_attention = bool(split_attention)
        self.prefix_cache = bool(prefix_cache and self.split_attention and _tp_size() == 1)
        if self.prefix_cache and cache_layout == "pool":
            # only then: the server's decoder checks the `SlotPrefixes` capability by its methods
            self.slot_pool = self._slot_pool
            self.write_slots = self._write_slots
            self.logits_after_slots = self._logits_after_slots
        if getattr(model, "length_head", None) is not None:
            # only then: generation treats the attribute's presence as "the model has a head"
            self.predict_lengths = self._predict_lengths

    def _predict_lengths(self, prefix_ids, prefix_lengths, k: int):
        """The length head's top-k target lengths `[g, k]` (best first, >= 1) for right-padded
        prefixes `[BOS] + source`: the generator's length-predictor hook."""
        with torch.no_grad():
            hidden = self.model(prefix_ids, valid_lengths=prefix_lengths, return_hidden=True)
            logits = self.model.length_head(self.model, hidden.transpose(0, 1), prefix_lengths=prefix_lengths)
        return self.model.length_head.predict(logits, k)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def logits(self, input_ids, lengths, split, positions):
        use_split = split if self.split_attention else None
        with torch.no_grad():
            hidden = self.model(input_ids, split=use_split, valid_lengths=lengths,
                                return_hidden=True)  # [b, s, h], after the final norm
        return self._head(hidden, positions)

    def _head(self, hidden, positions):
        """Logits `[b, k, V]` at `positions [b, k]` of the final hidden states `[b, s, h]`."""
        with torch.no_grad():
            picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
            logits, _ = self.model.output_layer(
                picked.transpose(0, 1).contiguous(),
                weight=self.model.output_projection_weight(), runtime_gather_output=True)
        return logits.transpose(0, 1)[..., :self.vocab_size]

    def _check_cache(self) -> None:
        if not self.prefix_cache:
            raise NotImplementedError(
                "this megatron adapter has no prefix cache (it needs split attention and TP=1; "
                f"split_attention={self.split_attention}, TP={_tp_size()})")

    def encode_prefix(self, prefix_ids, prefix_lengths) -> PrefixKV:
        self._check_cache()
        if self.cache_layout == "pool":
            return self._pool_encode(prefix_ids, prefix_lengths)
        cache = KVCacheForward()
        with torch.no_grad():
            # prefix rows see the prefix only: full attention among its real tokens
            self.model(prefix_ids, valid_lengths=prefix_lengths, return_hidden=True, kv_cache=cache)
        return cache.recorded(prefix_lengths)

    def logits_with_prefix(self, state: PrefixKV, rows, suffix_ids, suffix_lengths, positions):
        self._check_cache()
        if isinstance(state, SlotState):
            return self._logits_after_slots(state.slots_of(rows), suffix_ids, suffix_lengths, positions)
        cache = KVCacheForward(state.select(rows), record=False)
        with torch.no_grad():
            hidden = self.model(suffix_ids, valid_lengths=suffix_lengths, return_hidden=True,
                                kv_cache=cache)
        return self._head(hidden, positions)

    def _pool_step(self, ids, lengths, positions, cache) -> torch.Tensor:
        """Logits at `positions` of rows `ids` that follow their pool slots (`cache`)."""
        with torch.no_grad():
            hidden = self.model(ids, valid_lengths=lengths, return_hidden=True, kv_cache=cache)
        return self._head(hidden, positions)

    def extend_prefix(self, state: PrefixKV, rows, block_ids, block_lengths) -> PrefixKV:
        self._check_cache()
        if isinstance(state, SlotState):
            new = state.continued(_host(rows))
            self._write_slots(new.slots, block_ids, block_lengths)
            return new
        cache = KVCacheForward(state.select(rows))
        with torch.no_grad():
            self.model(block_ids, valid_lengths=block_lengths, return_hidden=True, kv_cache=cache)
        return cache.extended(block_lengths)

    def _slot_pool(self, slots: int) -> KVSlotPool:
        """`SlotPrefixes.slot_pool`: the one pool of this adapter (its prefix states use it too)."""
        if self._pool is None:
            cfg = self.model.config
            self._pool = KVSlotPool(cfg.num_layers, max(8, int(slots)), self.max_length,
                                    cfg.num_query_groups, cfg.kv_channels, next(self.model.parameters()).dtype,
                                    self.device)
        return self._pool

    def _write_slots(self, slots, ids, lengths) -> None:
        """`SlotPrefixes.write_slots`: the rows' keys/values join their slots (also how a prefix
        state's slots are filled and extended: the adapter has one pool)."""
        cache = PoolForward(self._pool, slots, _host(lengths))
        with torch.no_grad():
            self.model(ids, valid_lengths=lengths, return_hidden=True, kv_cache=cache)
        cache.commit()

    def _logits_after_slots(self, slots, ids, lengths, positions):
        """`SlotPrefixes.logits_after_slots`: the slots' lengths stay (what the forward wrote
        past them is overwritten by the next one); replayed from a CUDA graph where `step_graphs`
        has one for this shape."""
        if self._graphs is not None:
            with torch.no_grad():
                logits = self._graphs(self._pool, slots, ids, lengths, positions)
            if logits is not None:
                return logits
        return self._pool_step(ids, lengths, positions, PoolForward(self._pool, slots))

    def _pool_encode(self, prefix_ids, prefix_lengths) -> "SlotState":
        self._slot_pool(prefix_ids.shape[0])
        state = SlotState(self._pool, self._pool.allocate(prefix_ids.shape[0]))
        self._write_slots(state.slots, prefix_ids, prefix_lengths)
        return state

    def describe(self):
        return {**super().describe(), "split_mode": "native" if self.split_attention else "none",
                "model_class": type(self.model).__name__, "logits_at_positions_only": True,
                "prefix_cache_note": ("prefix keys/values reused (megatron kv_cache hook)"
                                      if self.prefix_cache else
                                      "no prefix cache (needs split attention at TP=1)")}


CACHE_LAYOUTS = ("grow", "pool")


class SlotState:
    """The pool layout's prefix state: row i of the decoder's prefixes lives in pool slot
    `slots[i]`. The slots go back to the pool when the state is dropped (a request leaving),
    except those handed on to the state that `continued` it."""

    def __init__(self, pool: KVSlotPool, slots: list[int]):
        self.pool = pool
        self.slots = list(slots)
        self._owned = list(slots)   # shared with the finalizer: what is released at drop
        weakref.finalize(self, pool.release, self._owned)

    def slots_of(self, rows) -> list[int]:
        return [self.slots[r] for r in _host(rows)]

    def continued(self, rows: list[int]) -> "SlotState":
        """The state whose row i continues row `rows[i]`: its slot is handed on, or copied when
        an earlier row already took it (a prompt's candidates diverge); rows left out leave."""
        taken, sources, targets, slots = set(), [], [], []
        for r in rows:
            slot = self.slots[r]
            if slot in taken:
                (fresh,) = self.pool.allocate(1)
                sources.append(slot)
                targets.append(fresh)
                slot = fresh
            taken.add(slot)
            slots.append(slot)
        if sources:
            self.pool.copy_slots(sources, targets)
        handed = set(slots)
        self._owned[:] = [s for s in self._owned if s not in handed]
        new = SlotState.__new__(SlotState)
        new.pool, new.slots, new._owned = self.pool, slots, list(slots)
        weakref.finalize(new, self.pool.release, new._owned)
        return new


def _host(values) -> list[int]:
    """Ints on the host (a CPU tensor or a list reads free; a device tensor costs a sync)."""
    return [int(v) for v in (values.tolist() if torch.is_tensor(values) else values)]


def megatron_adapter_for(model, tokenizer, *, split_attention: bool = True,
                         prefix_cache: bool = True) -> MegatronMaskedLMAdapter:
    """`make_adapter` for `ZeroShotTrainingHook` on the live training model (DDP-wrapped or
    not): the tokenizer gives the special ids and the vocabulary to keep."""
    module = getattr(model, "module", model)
    config = module.model_config
    return MegatronMaskedLMAdapter(module, inference_token_ids(tokenizer),
                                   vocab_size=config.vocab_size, max_length=config.seq_length,
                                   split_attention=split_attention, prefix_cache=prefix_cache)


def _tp_size() -> int:
    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_world_size()
    return 1
