"""Export: a megatron-biglm checkpoint (any TP/PP it was saved with) -> an HF model directory.

Streaming: the dist checkpoint is read one layer slice at a time (`checkpoint.dist_reader`; torch_dist
reassembles whatever TP/PP pieces the run saved), mapped to HF names one tensor at a time
(`weight_mapping.megatron_to_hf`) and written as safetensors shards holding at most one shard
in memory (`hf_files.save_safetensors_stream`). No model is built and no process group is
needed, so a 3.5B model never exists twice in memory.

Before any tensor is converted, every stored model item is checked against the CRC-32 it was
saved with (`checkpoint.verify`; the trainer's manifest already refuses missing and truncated
files). The directory is written under a temporary name beside `output_dir`, read back and
compared with the checkpoint, and only then renamed into place: a failed export leaves
nothing that would load.

A fine-tuned head model (classification, span) exports as its EuroBERT head class
(`head_export.py`); everything else as EuroBertForMaskedLM.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from megatron_biglm.checkpoint.verify import verify_checkpoint
from megatron_biglm.config.trained_checkpoint import open_checkpoint
from megatron_biglm.data.tokenizer_check import load_export_tokenizer

from .conversion_summary import ConversionSummary, VerificationError, compare_written, with_progress
from .head_export import export_head
from .hf_config import architecture_from_hf_config, hf_config_from_biglm, shape_from_biglm_config
from .hf_files import DEFAULT_MAX_SHARD_BYTES, HFWeights, save_safetensors_stream
from .model_card import model_card
from .weight_mapping import ConversionReport, hf_tensor_shapes, megatron_to_hf
from .weight_table import sidecar_file

logger = logging.getLogger(__name__)

DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


class ConversionError(RuntimeError):
    """A conversion cannot proceed as asked (output location, options); the message says why."""


def check_new_output(output_dir: Path, source: Path) -> None:
    """Refuse to write into a non-empty directory or into the source."""
    output_dir, source = output_dir.resolve(), source.resolve()
    if output_dir == source or source in output_dir.parents or output_dir in source.parents:
        raise ConversionError(f"output {output_dir} overlaps the source {source}; choose another directory")
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise ConversionError(f"output {output_dir} exists and is not empty; choose a new directory "
                              "or remove it first (the converter never mixes old and new files)")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def to_hf(checkpoint_dir, output_dir, *, tokenizer: str | None = None, dtype: str | None = None,
          max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: bool = True,
          verify: bool = True) -> ConversionSummary:
    """Write `output_dir` (config.json, model.safetensors [sharded], tokenizer, README.md).

    `checkpoint_dir`: an ``iter_N`` folder, a checkpoint root with ``latest`` or a run directory.
    `tokenizer`: a tokenizer directory to ship instead of the run's ``data.tokenizer`` (it must
    equal the run's one when that still exists). `dtype`: cast floating weights (fp32/bf16/fp16);
    None keeps the checkpoint's dtype. `verify`: CRC-check every stored item first (False:
    `--no-verify`, for storage one trusts).
    """
    if dtype is not None and dtype not in DTYPES:
        raise ConversionError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    checkpoint = open_checkpoint(checkpoint_dir)
    output_dir = Path(output_dir).expanduser()
    check_new_output(output_dir, checkpoint.path)
    mc = checkpoint.model_config
    tok, tok_source, notes = load_export_tokenizer(mc.vocab_size, checkpoint.run_config.data.tokenizer, tokenizer,
                                                   checkpoint.run_config.data.tokenizer_sha256)
    shape = shape_from_biglm_config(mc)
    weights = checkpoint.weights()
    stored = weights.stored_dtypes()
    cast = DTYPES[dtype] if dtype is not None else None
    out_dtype = cast or (stored[0] if len(stored) == 1 else torch.float32)
    if cast is None and len(stored) > 1:
        cast = torch.float32
        notes.append(f"the checkpoint mixes dtypes {stored}; exported as float32")
    head = export_head(checkpoint)  # a fine-tuned head model: its class and rows
    table = head.table if head is not None else None
    if head is not None and head.note:
        notes.append(head.note)
    report = ConversionReport()
    stream = megatron_to_hf(weights, shape, report=report, table=table)  # checks every key before reading
    notes.append(verify_checkpoint(checkpoint.path).note() if verify else  # flipped bytes keep the size
                 f"--no-verify: {checkpoint.path} was exported without its CRC-32 check")

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-", dir=output_dir.parent))
    try:
        files = save_safetensors_stream(
            temp, with_progress(stream, len(hf_tensor_shapes(shape, table)), "megatron -> HF", progress),
            max_shard_bytes=max_shard_bytes, dtype=cast)
        notes += save_sidecars(temp, weights, report, cast)
        hf_config = hf_config_from_biglm(mc, tok, dtype=_dtype_name(out_dtype))
        if head is not None:
            head.configure(hf_config)
        hf_config.save_pretrained(temp)
        tok.save_pretrained(str(temp))
        written = HFWeights(temp)
        parameters = sum(math.prod(s) for s in hf_tensor_shapes(shape, table).values())
        (temp / "README.md").write_text(model_card(checkpoint, parameters=parameters, tokenizer_source=tok_source,
                                                   dtype=_dtype_name(out_dtype)), encoding="utf-8")
        comparison = compare_written(written, megatron_to_hf(checkpoint.weights(), shape, table=table))
        if cast is None and comparison.max_abs_diff != 0.0:
            raise VerificationError(f"the written weights differ from the checkpoint by up to "
                                    f"{comparison.max_abs_diff} (at {comparison.worst}); the export was discarded")
        _check_reloadable(temp, shape)
        make_shareable(temp)
        if output_dir.exists():
            output_dir.rmdir()  # checked empty above
        os.replace(temp, output_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    padding = mc.padded_vocab_size - mc.vocab_size
    if padding:
        notes.append(f"{padding} megatron vocabulary padding rows were not exported")
    summary = ConversionSummary(
        direction="megatron -> HF", source=str(checkpoint.path), output=str(output_dir),
        tensors=comparison.tensors, source_parameters=weights.numel(), output_parameters=parameters,
        max_abs_diff=comparison.max_abs_diff, worst_tensor=comparison.worst, dtype=_dtype_name(out_dtype),
        files=[str(output_dir / f.name) for f in files], skipped={**weights.skipped, **report.ignored},
        notes=notes)
    logger.info("%s", summary.format())
    return summary


def save_sidecars(folder: Path, weights, report: ConversionReport, cast) -> list[str]:
    """Write the heads EuroBERT cannot hold (`weight_table.SIDECAR_HEADS`, e.g. the CMLM length
    head) to their own safetensors files, under their megatron names; notes for the summary."""

    files: dict[str, dict] = {}
    for key in report.ignored:
        name = sidecar_file(key)
        if name:
            tensor = weights[key]
            files.setdefault(name, {})[key] = (tensor.to(cast) if cast is not None else tensor).contiguous().clone()
    for name, tensors in files.items():
        save_file(tensors, str(folder / name), metadata={"format": "pt", "source": "megatron-biglm"})
    return [f"{name}: {', '.join(sorted(t))} (read by megatron_biglm.inference; plain transformers "
            "ignores it)" for name, t in files.items()]


def make_shareable(folder: Path) -> None:
    """Give the folder and its files the usual permissions (mkdtemp and the safetensors
    writer create owner-only ones), so an export can be shared as is."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _check_reloadable(model_dir: Path, shape) -> None:
    """config.json must read back as the architecture that was written (import accepts it)."""
    from transformers import AutoConfig  # lazy: start-up (transformers: 0.7 CPU s)

    arch = architecture_from_hf_config(AutoConfig.from_pretrained(str(model_dir)),
                                       padded_vocab_size=shape.padded_vocab_size)
    if arch.shape != shape:
        raise VerificationError(f"config.json reads back as {arch.shape}, not {shape}")
