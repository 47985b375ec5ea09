"""`load_for_generation(path)`: an adapter and tokenizer from an HF export or a megatron checkpoint.

Why one function for both: `MaskPredictGenerator.from_pretrained`, the CLI and lm-eval's
`generate_until` must decode the same way whatever the model came as, so the choice of backend
is made here, once, from what the path holds:
- a megatron checkpoint (root with `latest`, an `iter_*` folder, a run directory) is built
  in-process at TP=1/PP=1 (`inference.loading`) and run by the megatron adapter with its exact
  prefix K/V cache (split attention is native);
- an HF directory (`config.json`: our EuroBERT export, or any masked LM) is run by the HF adapter
  with the split applied as a 4D mask; split attention is required ("on"), since a Mask-Predict
  prefix that sees its slots is not BiGLM's model.

dtype: None means bfloat16 on GPU and float32 on CPU (CPU bf16 is slow and not what tests
compare); any explicit dtype is honoured.
"""
from __future__ import annotations

import os
from pathlib import Path


def default_dtype(device: str) -> str:
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def load_for_generation(path, *, device: str | None = None, dtype: str | None = None,
                        tokenizer=None, split_attention: str = "on", prefix_cache: str = "auto",
                        max_length: int | None = None, trust_remote_code: bool = False,
                        length_buckets="auto"):
    """`(adapter, tokenizer)` for the model at `path` (see the module docstring).
    `length_buckets`: padded widths rounded up so compiled kernels see few shapes
    (`inference.buckets`: "auto" = multiples of 64 on GPU, off on CPU; "pow2"; N; "off")."""
    adapter, tok = _load(path, device, dtype, tokenizer, split_attention, prefix_cache, max_length,
                         trust_remote_code)
    from megatron_biglm.inference.buckets import resolve_length_buckets

    adapter.length_buckets = resolve_length_buckets(length_buckets, adapter.device)
    return adapter, tok


def _load(path, device, dtype, tokenizer, split_attention, prefix_cache, max_length, trust_remote_code):
    from megatron_biglm.inference.loading import is_megatron_checkpoint, resolve_device

    device = resolve_device(device)
    dtype = dtype or default_dtype(device)
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a directory path, got {type(path).__name__}")
    if is_megatron_checkpoint(path):
        return _megatron(path, device, dtype, tokenizer, split_attention, prefix_cache, max_length)
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"{path} is neither an exported HF directory (no config.json) nor a megatron checkpoint "
            "(no `latest`, COMPLETE.json, checkpoints/latest or iter_* folders); pass the export "
            "directory or the checkpoint")
    return _hf(path, device, dtype, tokenizer, split_attention, prefix_cache, max_length,
               trust_remote_code)


def _hf(path, device, dtype, tokenizer, split_attention, prefix_cache, max_length, trust_remote_code):
    from transformers import AutoTokenizer

    from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
    from megatron_biglm.inference.loading import hf_max_length, load_hf_masked_lm
    from megatron_biglm.inference.protocol import inference_token_ids
    from megatron_biglm.inference.length_head_file import load_length_head

    model = load_hf_masked_lm(path, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
    tok = tokenizer if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)) \
        else AutoTokenizer.from_pretrained(str(tokenizer or path))
    adapter = HFMaskedLMAdapter(model, inference_token_ids(tok),
                                max_length=max_length or hf_max_length(model, tok),
                                split_attention=split_attention, prefix_cache=prefix_cache,
                                length_head=load_length_head(path, device=next(model.parameters()).device))
    return adapter, tok


def _megatron(path, device, dtype, tokenizer, split_attention, prefix_cache, max_length):
    from megatron_biglm.inference.loading import load_megatron_checkpoint
    from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter
    from megatron_biglm.inference.protocol import inference_token_ids

    loaded = load_megatron_checkpoint(path, tokenizer=tokenizer, device=device, dtype=dtype)
    model_max = int(loaded.checkpoint.model_config.seq_length)
    adapter = MegatronMaskedLMAdapter(
        loaded.model, inference_token_ids(loaded.tokenizer),
        vocab_size=loaded.checkpoint.model_config.vocab_size,
        max_length=min(int(max_length), model_max) if max_length else model_max,
        split_attention=split_attention != "off", prefix_cache=prefix_cache != "off")
    if prefix_cache == "on" and not adapter.prefix_cache:
        raise ValueError(f"prefix_cache=on impossible for {path}: the megatron adapter caches "
                         "prefixes only with split attention at TP=1")
    return adapter, loaded.tokenizer
