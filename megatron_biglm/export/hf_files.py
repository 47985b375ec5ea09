"""Write and read HF model weight files one tensor at a time.

Why not `model.save_pretrained`: that needs the whole HF model in memory next to the megatron
weights (two full copies of a 3.5B model). The writer takes the `(name, tensor)` stream of
`weight_mapping.megatron_to_hf` and holds at most one shard; the reader is a lazy Mapping
over safetensors shards (or PyTorch .bin files, which native EuroBERT checkpoints ship) that
loads a tensor only when asked. Layout and names follow transformers: `model.safetensors`,
or `model-0000i-of-0000N.safetensors` plus `model.safetensors.index.json`.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
BIN_WEIGHTS = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3

logger = logging.getLogger(__name__)


class CheckpointFileError(RuntimeError):
    """An HF weights directory is missing a file, has a corrupt one, or contradicts its index."""


def save_safetensors_stream(out_dir, tensors: Iterable[Tuple[str, torch.Tensor]], *,
                            max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                            dtype: torch.dtype | None = None) -> List[Path]:
    """Write the stream as (sharded) safetensors in `out_dir`; return the weight files written.

    A shard is flushed once adding the next tensor would pass `max_shard_bytes` (a single larger
    tensor gets a shard of its own). `dtype` casts floating tensors (e.g. bf16 export).
    """
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stale = [p for p in [out_dir / SAFE_WEIGHTS, out_dir / SAFE_INDEX,
                         *out_dir.glob("model-*-of-*.safetensors"), *out_dir.glob(".partial-*.safetensors")]
             if p.exists()]
    if stale:  # a mix of old and new shards would load as a corrupt model
        logger.warning("replacing %d existing weight files in %s", len(stale), out_dir)
    for path in stale:
        path.unlink()
    temp_files: List[Path] = []
    weight_map: Dict[str, int] = {}
    shard: Dict[str, torch.Tensor] = {}
    shard_bytes = total_bytes = 0

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            path = out_dir / f".partial-{len(temp_files):05d}.safetensors"
            save_file(shard, str(path), metadata={"format": "pt"})
            temp_files.append(path)
            shard, shard_bytes = {}, 0

    for name, tensor in tensors:
        if name in weight_map or name in shard:
            raise ValueError(f"tensor {name!r} appears twice in the stream")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if shard and shard_bytes + nbytes > max_shard_bytes:
            flush()
        shard[name] = tensor
        weight_map[name] = len(temp_files)
        shard_bytes += nbytes
        total_bytes += nbytes
    flush()
    if not temp_files:
        raise ValueError("the tensor stream was empty: nothing to save")
    if len(temp_files) == 1:
        final = [out_dir / SAFE_WEIGHTS]
    else:
        n = len(temp_files)
        final = [out_dir / f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        index = {"metadata": {"total_size": total_bytes},
                 "weight_map": {k: final[i].name for k, i in weight_map.items()}}
        (out_dir / SAFE_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    for temp, dest in zip(temp_files, final):
        os.replace(temp, dest)
    return final


class HFWeights(Mapping):
    """Lazy read-only ``name -> tensor`` view of an HF model directory's weight files."""

    def __init__(self, model_dir):
        self.model_dir = Path(model_dir)
        if not self.model_dir.is_dir():
            raise CheckpointFileError(f"{self.model_dir} is not a directory")
        self._file_of: Dict[str, Path] = {}
        self._cache_file: Path | None = None
        self._cache = None
        self._load_index()

    def _load_index(self):
        d = self.model_dir
        for index_name in (SAFE_INDEX, BIN_INDEX):
            if (d / index_name).exists():
                try:
                    weight_map = json.loads((d / index_name).read_text())["weight_map"]
                except (ValueError, KeyError) as exc:
                    raise CheckpointFileError(f"{d / index_name} is not a valid index: {exc}") from exc
                missing = sorted({f for f in weight_map.values() if not (d / f).exists()})
                if missing:
                    raise CheckpointFileError(
                        f"{d / index_name} lists shard files that are missing: {missing}; copy the "
                        "complete checkpoint (every shard) into the directory")
                self._file_of = {k: d / f for k, f in weight_map.items()}
                for path in sorted(set(self._file_of.values())):
                    self._check_shard(path, {k for k, p in self._file_of.items() if p == path})
                return
        for single in (SAFE_WEIGHTS, BIN_WEIGHTS):
            if (d / single).exists():
                names = self._open(d / single).keys()
                self._file_of = {k: d / single for k in names}
                return
        raise CheckpointFileError(
            f"{d} holds no model weights: expected {SAFE_WEIGHTS}, {SAFE_INDEX}, {BIN_WEIGHTS} or {BIN_INDEX}")

    def _check_shard(self, path: Path, listed: set):
        present = set(self._open(path).keys())
        absent = sorted(listed - present)
        if absent:
            raise CheckpointFileError(
                f"{path.name} lacks tensors its index assigns to it (first: {absent[:4]}); the "
                "shard is truncated or from another checkpoint")

    def _open(self, path: Path):
        """A keys()/get_tensor() view of one file; one file is kept open at a time."""
        if self._cache_file == path:
            return self._cache
        try:
            if path.suffix == ".safetensors":
                handle = safe_open(str(path), framework="pt")
            else:
                handle = _BinFile(torch.load(str(path), map_location="cpu", mmap=True, weights_only=True))
        except Exception as exc:  # safetensors raises its own error types; pickle many more
            raise CheckpointFileError(
                f"cannot read {path}: {type(exc).__name__}: {exc}; the file is corrupt or "
                "incomplete, re-copy it") from exc
        self._cache_file, self._cache = path, handle
        return handle

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self._file_of[name]
        try:
            return self._open(path).get_tensor(name)
        except KeyError:
            raise
        except Exception as exc:
            raise CheckpointFileError(f"cannot read tensor {name} from {path}: {exc}") from exc

    def __iter__(self) -> Iterator[str]:
        return iter(self._file_of)

    def __len__(self) -> int:
        return len(self._file_of)


class _BinFile:
    """Gives a torch.load()ed (mmap) dict the safe_open interface."""

    def __init__(self, state):
        self._state = state

    def keys(self):
        return list(self._state.keys())

    def get_tensor(self, name):
        return self._state[name]
