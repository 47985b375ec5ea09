"""Adapter over our megatron `BiGLMModel` run in-process (the `biglm` model on a megatron
checkpoint, or the live model inside training).

Why a dedicated adapter rather than `CallableMaskedLMAdapter`: BiGLMModel takes `split=` and
`valid_lengths=` natively (its attention builds the split mask itself, without a dense
`[b, s, s]` tensor), and its head is the tied embedding, so logits are computed only at the
positions the scoring rules read (`[b, k, V]` instead of `[b, s, V_padded]`).

Logits are sliced to the tokenizer's vocabulary: megatron pads the embedding to a multiple of
128 and those rows would otherwise take part in the softmax (the HF export drops them).

No prefix key/value reuse: megatron's attention has no cache input for a bidirectional
encoder, and adding one would mean copying its attention class. Prefix reuse goes through the
exported HF model (`to_hf`, then `biglm path=EXPORT_DIR`), whose scores are the same.
Pipeline parallelism is not supported here (one chunk must hold the whole model); tensor
parallelism works when every TP rank calls the adapter (the head gathers the vocabulary).
"""
from __future__ import annotations

import torch

from .protocol import MaskedLMAdapter, SpecialTokens


class MegatronMaskedLMAdapter(MaskedLMAdapter):
    """`model`: a `BiGLMModel` holding embedding, all layers and the head (PP = 1).
    `vocab_size`: the tokenizer's vocabulary (logits past it are dropped).
    `split_attention=False` for models trained without the restriction (variants mlm/no_attn)."""

    def __init__(self, model, special: SpecialTokens, *, vocab_size: int, max_length: int,
                 split_attention: bool = True):
        if not (getattr(model, "pre_process", True) and getattr(model, "post_process", True)):
            raise ValueError("the megatron adapter needs the whole model in one chunk (PP=1); "
                             "load the checkpoint with pipeline_model_parallel_size=1")
        padded = int(model.shared_embedding_or_output_weight().shape[0]) * _tp_size()
        if not 0 < int(vocab_size) <= padded:
            raise ValueError(f"vocab_size {vocab_size} does not fit the model's {padded} "
                             "embedding rows: the tokenizer is not the model's")
        self.model = model.eval()
        self.special = special
        self.vocab_size = int(vocab_size)
        self.max_length = int(max_length)
        self.split_attention = bool(split_attention)
        self.prefix_cache = False

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def logits(self, input_ids, lengths, split, positions):
        use_split = split if self.split_attention else None
        with torch.no_grad():
            hidden = self.model(input_ids, split=use_split, valid_lengths=lengths,
                                return_hidden=True)  # [b, s, h], after the final norm
            picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
            logits, _ = self.model.output_layer(
                picked.transpose(0, 1).contiguous(),
                weight=self.model.shared_embedding_or_output_weight(), runtime_gather_output=True)
        return logits.transpose(0, 1)[..., :self.vocab_size]

    def describe(self):
        return {**super().describe(), "split_mode": "native" if self.split_attention else "none",
                "model_class": type(self.model).__name__, "logits_at_positions_only": True,
                "prefix_cache_note": "megatron path: no prefix cache (use the HF export for reuse)"}


def megatron_adapter_for(model, tokenizer, *, split_attention: bool = True) -> MegatronMaskedLMAdapter:
    """`make_adapter` for `ZeroShotTrainingHook` on the live training model (DDP-wrapped or
    not): the tokenizer gives the special ids and the vocabulary to keep."""
    module = getattr(model, "module", model)
    config = module.model_config
    return MegatronMaskedLMAdapter(module, SpecialTokens.from_tokenizer(tokenizer),
                                   vocab_size=config.vocab_size, max_length=config.seq_length,
                                   split_attention=split_attention)


def _tp_size() -> int:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        return parallel_state.get_tensor_model_parallel_world_size()
    return 1
