"""Read a megatron `torch_dist` checkpoint's model tensors one (layer) slice at a time.

Why not `dist_checkpointing.load` with the model's sharded state dict: that builds the model
(a full copy) and, in one process, can only request whole tensors (its single-rank sharding
check refuses a partial access), and it needs a process group. Export must stream a 3.5B model,
so this reader talks to PyTorch DCP directly: it asks for exactly one layer's slice of one
stacked tensor, wherever the saving run's TP/PP ranks put its pieces (DCP reassembles them
from the saved chunk boxes). No process group, no model, no megatron import.

Megatron stores the layers of a stack as one global tensor per parameter kind,
``decoder.layers.<name>`` of shape ``[num_layers, ...]`` (global layer numbers, so PP stages
land in the same tensor); this view names the slices ``decoder.layers.<i>.<name>``, the TP=1
full state dict names that `weight_mapping.megatron_to_hf` expects.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

#: Top-level names of the model's tensors; everything else in the file (optimizer state,
#: `_extra_state` blobs) is counted and skipped.
MODEL_PREFIXES = ("embedding.", "decoder.", "output_layer.", "task_head.",  # task_head: fine-tuned heads
                  "length_head.")
_STACKED = re.compile(r"^decoder\.layers\.(?!\d+\.)(.+)$")


def stored_keys(dist_dir) -> set[str]:
    """Every key the torch_dist checkpoint in `dist_dir` stores (tensors and objects)."""
    return set(_CachedMetadataReader(str(dist_dir)).read_metadata().state_dict_metadata)


def stored_shapes(dist_dir) -> dict[str, tuple[int, ...]]:
    """The global shape of every tensor the torch_dist checkpoint in `dist_dir` stores."""
    meta = _CachedMetadataReader(str(dist_dir)).read_metadata().state_dict_metadata
    return {key: tuple(item.size) for key, item in meta.items() if hasattr(item, "size")}


class DistCheckpointReadError(RuntimeError):
    """A dist checkpoint cannot be read: missing/corrupt file or an unexpected layout."""


class _CachedMetadataReader(FileSystemReader):
    """Parses `.metadata` once per checkpoint (it also lists every optimizer entry)."""

    _metadata = None

    def read_metadata(self):
        if self._metadata is None:
            self._metadata = super().read_metadata()
        return self._metadata


class _SlicePlanner(DefaultLoadPlanner):
    """Reads one box (offsets, sizes) of one global tensor into a tensor of the box's shape."""

    def __init__(self, key: str, offsets: Tuple[int, ...], sizes: Tuple[int, ...]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._box = key, ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))

    def create_local_plan(self) -> LoadPlan:
        key, chunk = self._box
        return LoadPlan(create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk]))

    def lookup_tensor(self, index):
        return self.state_dict[index.fqn]  # the destination is the box itself, not the global tensor


class DistCheckpointWeights(Mapping):
    """Lazy ``full TP=1 name -> tensor`` view of the model part of a torch_dist checkpoint.

    `dist_dir` is the folder `dist_checkpointing.save` wrote (``iter_N/dist``).
    `num_layers` (from the run config) is checked against every stacked tensor.
    Tensors come back in their stored dtype; one slice is read per access.
    """

    def __init__(self, dist_dir, num_layers: int):
        self.dist_dir = Path(dist_dir)
        self.num_layers = num_layers
        if not (self.dist_dir / ".metadata").is_file():
            raise DistCheckpointReadError(
                f"{self.dist_dir} is not a torch_dist checkpoint (no .metadata file); point at a "
                "checkpoint written by megatron_biglm.cli.train (iter_N/, or its parent with `latest`)")
        self._reader = _CachedMetadataReader(str(self.dist_dir))
        try:
            metadata = self._reader.read_metadata()
        except Exception as exc:  # pickle / IO errors of a damaged .metadata
            raise DistCheckpointReadError(f"cannot read {self.dist_dir / '.metadata'}: {exc}") from exc
        #: name -> (stored key, layer index or None, slice shape, dtype)
        self._index: Dict[str, Tuple[str, int | None, Tuple[int, ...], torch.dtype]] = {}
        self.skipped: Dict[str, str] = {}
        for key, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                self.skipped[key] = "non-tensor entry (_extra_state / objects)"
                continue
            if not key.startswith(MODEL_PREFIXES):
                self.skipped[key] = "not a model tensor (optimizer state)"
                continue
            self._add(key, tuple(md.size), md.properties.dtype)

    def _add(self, key, size, dtype):
        stacked = _STACKED.match(key)
        if not stacked:
            self._index[key] = (key, None, size, dtype)
            return
        if not size or size[0] != self.num_layers:
            raise DistCheckpointReadError(
                f"{key} stacks {size[0] if size else 0} layers but the run config says num_layers="
                f"{self.num_layers}: the config.yaml beside the checkpoint does not describe it")
        for layer in range(self.num_layers):
            self._index[f"decoder.layers.{layer}.{stacked.group(1)}"] = (key, layer, size[1:], dtype)

    def shape(self, name: str) -> Tuple[int, ...]:
        return self._index[name][2]

    def dtype(self, name: str) -> torch.dtype:
        return self._index[name][3]

    def __getitem__(self, name: str) -> torch.Tensor:
        key, layer, shape, dtype = self._index[name]
        if layer is None:
            offsets, sizes = (0,) * len(shape), shape
        else:
            offsets, sizes = (layer,) + (0,) * len(shape), (1,) + shape
        out = torch.empty(sizes, dtype=dtype)
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
                warnings.filterwarnings("ignore", message=".*load in a single process")
                dcp.load({key: out}, storage_reader=self._reader,
                         planner=_SlicePlanner(key, offsets, sizes), no_dist=True)
        except Exception as exc:  # DCP wraps per-file IO/unpickling errors in CheckpointException
            raise DistCheckpointReadError(
                f"cannot read {name} ({key}) from {self.dist_dir}: {type(exc).__name__}: "
                f"{str(exc)[:500]}; a shard file is missing or corrupt, re-copy the checkpoint") from exc
        return out[0] if layer is not None else out

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def numel(self) -> int:
        """Elements of all model tensors (megatron side: vocab padding rows included)."""
        total = 0
        for _, _, shape, _ in self._index.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    def stored_dtypes(self) -> List[torch.dtype]:
        return sorted({v[3] for v in self._index.values()}, key=str)
