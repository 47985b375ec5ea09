"""Load a megatron-biglm checkpoint for inference (scoring, generation) in this process (TP=1, PP=1).

The checkpoint may have been saved at any TP/PP: `load_model_weights` reshards it to the
in-process layout. The tokenizer is the run's own (`data.tokenizer` of the saved run config),
loaded exactly as training loaded it, or one passed explicitly (checked against the run's).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

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
    from megatron_biglm.data.tokenizer_check import TokenizerMismatch, load_export_tokenizer

    if override is not None and not isinstance(override, (str, os.PathLike)):
        return override  # a tokenizer object: the caller vouches for it
    try:
        tok, source, more = load_export_tokenizer(
            checkpoint.model_config.vocab_size, checkpoint.run_config.data.tokenizer,
            None if override is None else str(override))
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
    from megatron_biglm.checkpoint.verify import verify_checkpoint
    from megatron_biglm.checkpoint.weights_only import load_model_weights
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.model import init_single_process, model_provider
    from megatron_biglm.model.head_model import head_model_provider, head_of_checkpoint

    checkpoint = open_checkpoint(path)  # clear CheckpointError for missing/partial folders
    notes: list = [verify_checkpoint(checkpoint.path).note() if verify else
                   f"verify=false: {checkpoint.path} was loaded without its CRC-32 check"]
    tok = _tokenizer(checkpoint, tokenizer, notes)
    params_dtype = _params_dtype(dtype, checkpoint)
    init_single_process(tp=1, pp=1)
    _ensure_rng_tracker()
    head = head_of_checkpoint(checkpoint)
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
    from megatron.core import tensor_parallel

    if not tensor_parallel.get_cuda_rng_tracker().is_initialized():
        tensor_parallel.model_parallel_cuda_manual_seed(0)


# ---------------------------------------------------------------------- HF exports
HF_DTYPES = ("auto", "float32", "float64", "bfloat16", "float16")


def resolve_device(device: str | None) -> str:
    """`device`, or CUDA when available; a CUDA request on a machine without CUDA runs on CPU
    with a warning instead of failing (lm-eval's CLI asks for cuda:0 by default)."""
    import logging

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
    from transformers import AutoModelForMaskedLM

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


def hf_max_length(model, tokenizer) -> int:
    """The model's positions, capped by the tokenizer's limit when it states a real one
    (RoBERTa's 514 positions hold 512 tokens)."""
    limit = int(getattr(model.config, "max_position_embeddings", 512))
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_limit, int) and 0 < tok_limit < 1_000_000:
        limit = min(limit, tok_limit)
    return limit
