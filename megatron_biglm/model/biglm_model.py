"""`BiGLMModel`: megatron-core's GPTModel with BiGLM's split attention and sparse prediction.

A thin subclass: GPTModel's constructor already builds what BiGLM needs (word embedding,
RoPE, a TransformerBlock from our layer spec, a column-parallel output layer tied to the
embedding, pipeline-stage handling, sharded state dicts). Only `forward` differs:

  model(input_ids, position_ids=None, *, split=None, valid_lengths=None,
        labels=None, loss_mask=None, predicted_rows=None, decoder_input=None, return_hidden=False)

- `split` [b]: prefix lengths; prefix positions attend to the prefix only, suffix positions
  to everything (the rule: `objective.split_rule.visible`). Split 0 makes every position a
  suffix position: an all-0 split (what variants `mlm`, `no_attn` emit) or None is full
  bidirectional attention, with no mask built.
- `valid_lengths` [b]: optional right padding; keys past it are masked.
- With `labels` and `loss_mask` [b, s] (last pipeline stage): returns the per-token loss
  [b, s] fp32, 0 where loss_mask is 0. Without labels: logits [b, s, vocab/tp] (or the
  hidden states [b, s, h] with `return_hidden`). Both come from the masked-LM head
  (`heads.py`, `loss.py`). `predicted_rows`: `loss.predicted_rows` of the loader's host
  mask, so the loss picks its rows without reading the device mask back.
- `length_prefix` [b] (needs `model.length_head_max > 0`): also return the length head's
  logits [b, max + 1] from the mean of the prefix rows [0, length_prefix): `(output, logits)`.
- Not the last pipeline stage: the hidden states [s, b, h] for the next stage.
- `kv_cache` (inference, TP=1/PP=1; see `kv_cache.py`): a `KVCacheForward` that records the
  layers' keys/values, or a `kv_pool.PoolForward` that writes them into preallocated slots;
  with cached rows (`kv_cache.past`) the input rows continue them (RoPE
  positions from the cached lengths, attention to cached + new real keys; `split` is ignored).

The attention mask is built once here from `split` and reaches every layer (see
`attention_params`). Every pipeline stage needs `split` (and the same `input_ids` shape or
its received activations) to build it.
"""
from __future__ import annotations

from typing import Optional

import torch
from megatron.core import parallel_state
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region
from megatron.core.transformer.transformer_config import TransformerConfig

from .attention_params import BiGLMAttentionParams, build_attention_params, resolve_backend, resolve_compile
from .config import BiGLMModelConfig
from .core_attention import kv_ports_attached
from .grad_layout import contiguous_grad
from .heads import build_head
from .kv_cache import KVCacheForward
from .kv_pool import PoolForward
from .layer_compile import (
    apply_compile_settings,
    compile_layers,
    compile_layers_on,
    mark_dynamic_inputs,
    mark_dynamic_ports,
    standard_strides,
)
from .layer_spec import biglm_block_spec, resolve_transformer_impl


class BiGLMModel(GPTModel):
    """BiGLM encoder on megatron-core (RMSNorm, SwiGLU, RoPE, GQA, no bias, tied embeddings)."""

    def __init__(
        self,
        config: TransformerConfig,
        model_config: BiGLMModelConfig,
        pre_process: bool = True,
        post_process: bool = True,
        vp_stage: Optional[int] = None,
        pg_collection=None,
    ):
        super().__init__(
            config=config,
            transformer_layer_spec=biglm_block_spec(
                config, vp_stage=vp_stage, impl=resolve_transformer_impl(model_config.transformer_impl)),
            vocab_size=model_config.padded_vocab_size,
            max_sequence_length=model_config.seq_length,
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,
            share_embeddings_and_output_weights=not model_config.untie_embeddings_and_output_weights,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=model_config.rotary_base,
            vp_stage=vp_stage,
            pg_collection=pg_collection,
        )
        self.model_config = model_config
        self.attention_backend = resolve_backend(
            model_config.attention_backend, config.params_dtype, model_config.attention_dropout)
        # `auto`, True or False; resolved per forward against the device the weights are on.
        self.attention_compile = model_config.attention_compile
        self.layers_compiled = compile_layers_on(model_config.compile_layers)
        if self.layers_compiled:
            compile_layers(self.decoder.layers)  # one graph per layer: see layer_compile.py
        if self.post_process:
            # Under sequence parallelism we all-gather the hidden states ourselves before
            # picking the predicted rows, so the output layer must not gather again.
            self.output_layer.sequence_parallel = False
        # The masked-LM head (see heads.py): no weights of its own, it uses output_layer.
        self.lm_head = build_head("masked_lm")
        # The optional CMLM length head (weights `length_head.*`): only when configured, so a
        # model without it keeps exactly its state dict.
        if self.post_process and model_config.length_head_max > 0:
            self.length_head = build_head("length", hidden_size=config.hidden_size,
                                          max_length=model_config.length_head_max,
                                          init_std=config.init_method_std)

    def forward(
        self,
        input_ids: Optional[torch.Tensor],
        position_ids: Optional[torch.Tensor] = None,
        *,
        split: Optional[torch.Tensor] = None,
        valid_lengths: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        loss_mask: Optional[torch.Tensor] = None,
        predicted_rows: Optional[torch.Tensor] = None,
        decoder_input: Optional[torch.Tensor] = None,
        return_hidden: bool = False,
        runtime_gather_output: Optional[bool] = None,
        kv_cache: Optional[KVCacheForward | PoolForward] = None,
        length_prefix: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        if position_ids is not None:
            raise ValueError(
                "BiGLM applies RoPE at positions 0..s-1 of each sample; pass position_ids=None"
            )
        decoder_input, rotary_pos_emb = self._preprocess(
            input_ids=input_ids, position_ids=None, decoder_input=decoder_input
        )[:2]
        if kv_cache is not None and kv_cache.past is not None:
            rotary_pos_emb, attn_params = self._cached_attention(input_ids, valid_lengths, kv_cache)
        else:
            device = self._device()
            attn_params = build_attention_params(
                split,
                self._sequence_length(input_ids, decoder_input),
                self.attention_backend,
                valid_lengths=valid_lengths,
                device=device,
                compile_flex=resolve_compile(self.attention_compile, device),
            )
        if self.layers_compiled:
            apply_compile_settings()
        if self.layers_compiled and decoder_input is not None:
            decoder_input = standard_strides(decoder_input)
            mark_dynamic_inputs(decoder_input, rotary_pos_emb, attn_params)
        ports = [] if kv_cache is None else kv_cache.layer_ports(
            len(self.decoder.layers), self._sequence_length(input_ids, decoder_input))
        if self.layers_compiled:
            mark_dynamic_ports(ports)
        with kv_ports_attached(self.decoder.layers if ports else [], ports):
            hidden = self.decoder(
                hidden_states=decoder_input,
                attention_mask=None,
                rotary_pos_emb=rotary_pos_emb,
                packed_seq_params=attn_params,
            )
        if not self.post_process:
            return hidden
        if self.config.sequence_parallel:
            # Backward: each rank keeps its slice of the (already TP-reduced) gradient.
            hidden = gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=False, group=parallel_state.get_tensor_model_parallel_group())
        hidden = contiguous_grad(hidden)  # the heads read it batch-first: see grad_layout.py
        if return_hidden:
            return hidden.transpose(0, 1).contiguous()
        output = self.lm_head(self, hidden, labels=labels, loss_mask=loss_mask, predicted_rows=predicted_rows,
                              runtime_gather_output=runtime_gather_output)
        if length_prefix is None:
            return output
        if getattr(self, "length_head", None) is None:
            raise ValueError("length_prefix asks for the length head, but this model has none; "
                             "set model.length_head_max > 0 (the longest target to classify)")
        return output, self.length_head(self, hidden, prefix_lengths=length_prefix.to(hidden.device))

    def output_projection_weight(self) -> Optional[torch.Tensor]:
        """The weight to pass `output_layer` (the tied word embedding), or None when the
        output layer has its own (`untie_embeddings_and_output_weights`)."""
        return self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None

    def _cached_attention(self, input_ids, valid_lengths, kv_cache: KVCacheForward | PoolForward):
        """RoPE and mask for rows that follow cached ones (inference, PP=1): row b's token j
        sits at position `cached_length[b] + j`, and attends to every real cached key and
        every real key of this forward (SDPA with the cache's mask: a dense `[q, w + q]` grid
        for the growing cache, a `[1, k]` key-padding row per sample for the slot pool)."""
        if input_ids is None or not (self.pre_process and self.post_process):
            raise ValueError("the prefix cache needs the whole model in one chunk (PP=1) and input_ids")
        b, q = input_ids.shape
        if valid_lengths is None:
            valid_lengths = torch.full((b,), q, dtype=torch.long, device=input_ids.device)
        positions = kv_cache.positions(q).to(input_ids.device)  # [b, q]
        table = self.rotary_pos_emb(kv_cache.position_limit(q))  # [n, 1, 1, d]
        rotary = table[:, 0].index_select(0, positions.t().reshape(-1)).reshape(q, b, 1, -1)
        masked = kv_cache.masked_keys(valid_lengths.to(input_ids.device), q)
        params = BiGLMAttentionParams(backend="sdpa", derived=~masked)
        return rotary, params

    def _sequence_length(self, input_ids, decoder_input) -> int:
        """Full sequence length, also on pipeline stages that only receive activations."""
        if input_ids is not None:
            return int(input_ids.shape[1])
        hidden = decoder_input if decoder_input is not None else self.decoder.input_tensor
        if hidden is None:
            raise ValueError("pass input_ids (or decoder_input) so the attention mask has a length")
        s = int(hidden.shape[0])
        return s * self.config.tensor_model_parallel_size if self.config.sequence_parallel else s

    def _device(self) -> torch.device:
        return next(self.parameters()).device

