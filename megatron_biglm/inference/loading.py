"""The one inference loader: a model for scoring, generation and embedding, from a megatron
checkpoint or an HF directory, in this process.

`load_adapter(source)` is what lm-eval (`evaluation.models`), Mask-Predict
(`MaskPredictGenerator.from_pretrained`), the multitask evaluation and every CLI call: it looks
at what the path holds and returns a `MaskedLMAdapter` with its tokenizer, so every consumer
picks the backend, the split and the prefix cache by the same rules:
- a megatron checkpoint (root with `latest`, an `iter_*` folder, a run directory; saved at any
  TP/PP) is built at TP=1/PP=1 (`load_megatron_checkpoint`, which retrieval and the fine-tuning
  start scores use directly for the bare model) and run by the megatron adapter, split attention
  native and the exact prefix K/V cache on;
- an HF directory (`config.json`: our EuroBERT export, or any masked LM) or an HF model object is
  run by the HF adapter, the split applied as a 4D mask.

Split attention, `split_attention=None`: a megatron checkpoint runs as it was trained
(`split_attention_for_variant`: on for `objective.variant: biglm`, off for `mlm`/`no_attn`); an
HF directory gets `hf_split_attention` ("on" for BiGLM consumers, since a prefix that sees its
suffix is not BiGLM's model; "auto" for any masked LM). The tokenizer of a megatron checkpoint is
the run's own (`data.tokenizer` of the saved run config), loaded exactly as training loaded it,
or one passed explicitly (checked against the run's).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from megatron.core import tensor_parallel
from safetensors.torch import load_file

from megatron_biglm.checkpoint.verify import verify_checkpoint
from megatron_biglm.checkpoint.weights_only import load_model_weights
from megatron_biglm.config.trained_checkpoint import open_checkpoint
from megatron_biglm.data.tokenizer_check import TokenizerMismatch, load_export_tokenizer
from megatron_biglm.model import init_single_process, model_provider
from megatron_biglm.model.head_model import head_model_provider, head_of_record
from megatron_biglm.model.heads import LengthHead

from .buckets import resolve_length_buckets
from .hf_adapter import HFMaskedLMAdapter
from .megatron_adapter import CACHE_LAYOUTS, MegatronMaskedLMAdapter
from .protocol import inference_token_ids

#: model-arg dtype -> megatron params dtype ("auto": the checkpoint's stored dtype)
_PARAMS_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclass
class LoadedMegatron:
    model: object          # BiGLMModel (BiGLMHeadModel for a head fine-tune), eval mode, on the requested device
    tokenizer: object
    checkpoint: object     # megatron_biglm.config.trained_checkpoint.TrainedCheckpoint
    notes: list


def is_megatron_checkpoint(path) -> bool:
    """The trainer's layout: a checkpoint root (`latest`), one `iter_*` folder
    (`COMPLETE.json`), a run directory (`checkpoints/latest`), or a folder of `iter_*`.
    An HF directory (config.json) never counts, even if it sits inside a run."""
    path = Path(path).expanduser()
    if not path.is_dir() or (path / "config.json").is_file():
        return False
    markers = ("latest", "COMPLETE.json", "checkpoints/latest", ".metadata")
    return any((path / m).exists() for m in markers) or any(path.glob("iter_*"))


def _params_dtype(dtype: str, checkpoint) -> str:
    if dtype == "auto":
        stored = checkpoint.weights().stored_dtypes()
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(stored[0], "fp32") \
            if len(stored) == 1 else "fp32"
    if dtype not in _PARAMS_DTYPE:
        raise ValueError(f"a megatron checkpoint runs in one of {sorted(_PARAMS_DTYPE)} or auto, "
                         f"not {dtype!r}")
    return _PARAMS_DTYPE[dtype]


def _tokenizer(checkpoint, override, notes: list):
    if override is not None and not isinstance(override, (str, os.PathLike)):
        return override  # a tokenizer object: the caller vouches for it
    try:
        tok, source, more = load_export_tokenizer(
            checkpoint.model_config.vocab_size, checkpoint.run_config.data.tokenizer,
            None if override is None else str(override), checkpoint.run_config.data.tokenizer_sha256)
    except TokenizerMismatch as exc:
        raise ValueError(f"{checkpoint.path}: {exc}\n  (for the biglm lm-eval model pass "
                         "tokenizer=DIR in the model args)") from None
    notes.extend(more)
    notes.append(f"tokenizer: {source}")
    return tok


def load_megatron_checkpoint(path, *, tokenizer=None, device: str = "cpu",
                             dtype: str = "float32", verify: bool = True) -> LoadedMegatron:
    """Build the model at TP=1/PP=1 in this process, load the checkpoint's weights into it
    and find its tokenizer. Sets up a one-process group (gloo on CPU) when none exists.
    `verify`: CRC-check every stored item first (checkpoint/verify.py); False skips it."""
    checkpoint = open_checkpoint(path)  # clear CheckpointError for missing/partial folders
    notes: list = [verify_checkpoint(checkpoint.path).note() if verify else
                   f"verify=false: {checkpoint.path} was loaded without its CRC-32 check"]
    tok = _tokenizer(checkpoint, tokenizer, notes)
    params_dtype = _params_dtype(dtype, checkpoint)
    init_single_process(tp=1, pp=1)
    _ensure_rng_tracker()
    record, note = checkpoint.task_head()
    notes += [note] if note else []
    head = head_of_record(record)
    if head is None:
        model = model_provider(True, True, config=checkpoint.model_config, params_dtype=params_dtype)
    else:  # a fine-tuned classification / span model: the trunk and its task head
        tcfg = checkpoint.model_config.to_transformer_config(params_dtype=params_dtype)
        model = head_model_provider(*head)(True, True, checkpoint.model_config, tcfg)
    load_model_weights(checkpoint.path, model, verify=False)  # verified above
    saved = checkpoint.run_config.parallelism
    notes.append(f"loaded {checkpoint.path} (saved at TP={saved.tensor_model_parallel_size}, "
                 f"PP={saved.pipeline_model_parallel_size}) at TP=1, PP=1, {params_dtype}")
    return LoadedMegatron(model.to(device).eval(), tok, checkpoint, notes)


def _ensure_rng_tracker() -> None:
    """megatron's layers draw their (overwritten) init from the model-parallel RNG tracker;
    seed it only when nobody has, so a training process keeps its own streams."""
    if not tensor_parallel.get_cuda_rng_tracker().is_initialized():
        tensor_parallel.model_parallel_cuda_manual_seed(0)


# ---------------------------------------------------------------------- HF exports
HF_DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")


def resolve_device(device: str | None) -> str:
    """`device`, or CUDA when available; a CUDA request on a machine without CUDA runs on CPU
    with a warning instead of failing (lm-eval's CLI asks for cuda:0 by default)."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        logging.getLogger(__name__).warning(
            "device %s requested but CUDA is not available: running on cpu", device)
        return "cpu"
    return str(device)


def load_hf_masked_lm(path, *, device: str = "cpu", dtype: str = "float32",
                      trust_remote_code: bool = False):
    """`AutoModelForMaskedLM.from_pretrained(path)` on `device` in `dtype`, in eval mode."""
    from transformers import AutoModelForMaskedLM  # lazy: start-up (transformers: 0.7 CPU s)

    if dtype not in HF_DTYPES:
        raise ValueError(f"dtype must be one of {HF_DTYPES}, got {dtype!r}")
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    try:
        model = AutoModelForMaskedLM.from_pretrained(str(path), dtype=torch_dtype,
                                                     trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ValueError(f"could not load a masked LM from {path}: {exc}\n  (an HF directory with "
                         "config.json and weights is needed; models with their own code need "
                         "trust_remote_code=true)") from exc
    return model.to(device).eval()


#: the CMLM length head of an HF export, which `EuroBertForMaskedLM` cannot hold natively:
#: export writes it beside the model (tensors `length_head.weight` [max + 1, h] and
#: `length_head.bias`, the megatron names; `export.weight_table.SIDECAR_HEADS`); plain
#: transformers ignores the file
LENGTH_HEAD_FILE = "length_head.safetensors"


def load_length_head(model_dir, device: torch.device | str = "cpu"):
    """The export's length head (`model.heads.LengthHead`, so `HFMaskedLMAdapter` offers
    `predict_lengths` like the megatron adapter), or None when the export has none."""

    path = Path(model_dir) / LENGTH_HEAD_FILE
    if not path.is_file():
        return None
    tensors = load_file(str(path))
    try:
        weight, bias = tensors["length_head.weight"], tensors["length_head.bias"]
    except KeyError as exc:
        raise ValueError(f"{path} lacks {exc}; re-export the checkpoint (it should hold "
                         "length_head.weight and length_head.bias)") from None
    head = LengthHead(weight.shape[1], weight.shape[0] - 1)
    head.load_state_dict({"weight": weight, "bias": bias})
    return head.to(device).eval()


def hf_max_length(model, tokenizer) -> int:
    """The model's positions, capped by the tokenizer's limit when it states a real one
    (RoBERTa's 514 positions hold 512 tokens)."""
    limit = int(getattr(model.config, "max_position_embeddings", 512))
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_limit, int) and 0 < tok_limit < 1_000_000:
        limit = min(limit, tok_limit)
    return limit


# ---------------------------------------------------------------------- one entry
TRISTATE = ("auto", "on", "off")


def default_dtype(device: str) -> str:
    """bfloat16 on GPU, float32 on CPU (CPU bf16 is slow and not what the tests compare)."""
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def split_attention_for_variant(variant: str, requested: str | None) -> tuple[str, str]:
    """("on"/"off", why) for a megatron checkpoint trained as `variant` (objective.variant).

    Run as trained by default: `biglm` was trained with split attention, `mlm` and `no_attn`
    with full attention, so scoring or generating those with the split would measure a model
    that never existed. An explicit "on"/"off" wins, and the reason is kept with the adapter
    (lm-eval writes it to the results JSON)."""
    if requested in ("on", "off"):
        return requested, f"split_attention={requested} (argument; checkpoint trained as {variant!r})"
    chosen = "on" if variant == "biglm" else "off"
    return chosen, f"{chosen}: the checkpoint's objective.variant is {variant!r}"


@dataclass
class LoadedAdapter:
    adapter: object        # a MaskedLMAdapter (megatron or HF)
    tokenizer: object
    notes: list = field(default_factory=list)   # what the loader decided, for logs and results
    split_attention_choice: str = ""             # megatron: the split and why (as trained or asked)


def load_adapter(source, *, tokenizer=None, device: str | None = None, dtype: str | None = None,
                 split_attention: str | None = None, hf_split_attention: str = "on",
                 prefix_cache: str = "auto", max_length: int | None = None,
                 trust_remote_code: bool = False, length_buckets="auto",
                 verify: bool = True, cache_layout: str = "grow") -> LoadedAdapter:
    """A `MaskedLMAdapter` and its tokenizer for `source` (see the module docstring): a
    megatron checkpoint, an HF directory, or an HF model object (then `tokenizer` is needed).
    `dtype` None: `default_dtype(device)`. `prefix_cache`: auto (cache where exact), on (fail
    where it cannot be), off. `length_buckets`: padded widths rounded up so compiled kernels
    see few shapes (`inference.buckets`). `verify`: CRC-check a megatron checkpoint first.
    `cache_layout` (megatron checkpoints): "grow" or "pool", the prefix cache's keys/values as
    growing tensors or in a preallocated slot pool (`MegatronMaskedLMAdapter`); an HF export's
    cache is transformers' own (the pool writes through megatron's `kv_cache` hook)."""
    if cache_layout not in CACHE_LAYOUTS:
        raise ValueError(f"cache_layout must be one of {CACHE_LAYOUTS}, got {cache_layout!r}")
    for name, value in (("prefix_cache", prefix_cache), ("hf_split_attention", hf_split_attention)):
        if value not in TRISTATE:
            raise ValueError(f"{name} must be one of {TRISTATE}, got {value!r}")
    if split_attention is not None and split_attention not in TRISTATE:
        raise ValueError(f"split_attention must be one of {TRISTATE}, got {split_attention!r}")
    device = resolve_device(device)
    dtype = str(dtype or default_dtype(device))
    if isinstance(source, (str, os.PathLike)) and is_megatron_checkpoint(source):
        loaded = _megatron_adapter(source, tokenizer, device, dtype, split_attention, prefix_cache,
                                   max_length, verify, cache_layout)
    elif cache_layout != "grow":
        raise ValueError(f"cache_layout={cache_layout!r} is for megatron checkpoints; {source} is an HF "
                         "model, whose cache is transformers' own: leave cache_layout at 'grow'")
    else:
        loaded = _hf_adapter(source, tokenizer, device, dtype,
                             split_attention if split_attention is not None else hf_split_attention,
                             prefix_cache, max_length, trust_remote_code)
    loaded.adapter.length_buckets = resolve_length_buckets(length_buckets, loaded.adapter.device)
    return loaded


def _megatron_adapter(path, tokenizer, device, dtype, split_attention, prefix_cache, max_length,
                      verify, cache_layout) -> LoadedAdapter:
    loaded = load_megatron_checkpoint(path, tokenizer=tokenizer, device=device, dtype=dtype,
                                      verify=verify)
    variant = loaded.checkpoint.run_config.objective.resolved.variant
    split, why = split_attention_for_variant(variant, split_attention)
    model_max = int(loaded.checkpoint.model_config.seq_length)
    adapter = MegatronMaskedLMAdapter(
        loaded.model, inference_token_ids(loaded.tokenizer),
        vocab_size=loaded.checkpoint.model_config.vocab_size,
        max_length=min(int(max_length), model_max) if max_length else model_max,
        split_attention=split == "on", prefix_cache=prefix_cache != "off", cache_layout=cache_layout)
    if prefix_cache == "on" and not adapter.prefix_cache:
        raise ValueError(f"prefix_cache=on is impossible for {path}: the megatron adapter caches "
                         f"prefixes only with split attention at TP=1 (split attention: {why})")
    return LoadedAdapter(adapter, loaded.tokenizer, loaded.notes, why)


def _hf_adapter(source, tokenizer, device, dtype, split_attention, prefix_cache, max_length,
                trust_remote_code) -> LoadedAdapter:
    is_path = isinstance(source, (str, os.PathLike))
    if is_path and not (Path(source).expanduser() / "config.json").is_file():
        raise FileNotFoundError(
            f"{source} is neither an exported HF directory (no config.json) nor a megatron checkpoint "
            "(no `latest`, COMPLETE.json, checkpoints/latest or iter_* folders); pass the export "
            "directory or the checkpoint")
    if not is_path and tokenizer is None:
        raise ValueError("a model object needs tokenizer= (a directory or tokenizer object)")
    model = load_hf_masked_lm(source, device=device, dtype=dtype,
                              trust_remote_code=trust_remote_code) if is_path else source
    tok = tokenizer if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)) \
        else _auto_tokenizer(tokenizer if tokenizer is not None else source)
    length_head = load_length_head(source, device=next(model.parameters()).device) if is_path else None
    adapter = HFMaskedLMAdapter(model, inference_token_ids(tok),
                                max_length=max_length or hf_max_length(model, tok),
                                split_attention=split_attention, prefix_cache=prefix_cache,
                                length_head=length_head)
    return LoadedAdapter(adapter, tok, [f"loaded {source}" if is_path else
                                        f"model object {type(model).__name__}"])


def _auto_tokenizer(path):
    from transformers import AutoTokenizer  # lazy: start-up (transformers: 0.7 CPU s)

    return AutoTokenizer.from_pretrained(str(path))
