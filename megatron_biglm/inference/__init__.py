"""Running a trained masked LM: the model side shared by scoring and generation.

Floor 3 (imports common, checkpoint, objective, patches, model, data, config; never training,
export, evaluation or generation; masks come from
`model/attention_masks/`, derived from the one split rule).

  protocol.py          `MaskedLMAdapter`: logits at positions, split attention, the exact
                       prefix cache (`encode_prefix`, `logits_with_prefix`, `extend_prefix`);
                       `BlockCausalLogits`, the uncached block-causal forward
  hf_adapter.py        any HF `AutoModelForMaskedLM` (probed: 4D split mask, DynamicCache)
  megatron_adapter.py  our `BiGLMModel` in-process (split native; cache via `model.kv_cache`)
  callable_adapter.py  a plain `forward(ids, allowed)` function
  engine.py            grouping by prefix, padded batches, `PrefixCache`, `run_rows`
  buckets.py           padded lengths rounded up to buckets (few shapes for compiled kernels)
  loading.py           the one loader: `load_adapter` (megatron checkpoint or HF directory ->
                       adapter + tokenizer), `load_megatron_checkpoint` (the bare model at
                       TP=1/PP=1), an HF export's length head

`TokenIds` (the one special-token record, defined in `megatron_biglm.data.token_ids`) is
re-exported here. Submodules are imported on use: nothing heavy happens at package import.
"""
from __future__ import annotations

from megatron_biglm.data.token_ids import TokenIds

from .protocol import BlockCausalLogits, LengthPrediction, MaskedLMAdapter, inference_token_ids

__all__ = ["BlockCausalLogits", "LengthPrediction", "MaskedLMAdapter", "TokenIds", "inference_token_ids"]
