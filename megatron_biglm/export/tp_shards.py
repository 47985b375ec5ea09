"""Split one full (TP=1) megatron tensor into tensor-parallel shards, or merge shards back.

Why per tensor: converters stream a checkpoint tensor by tensor, so a TP=2 checkpoint is merged
(or a TP=1 one split) without materialising the whole model. The axis follows the layer kind:

* column-parallel (`linear_qkv`, `linear_fc1`, `output_layer`) and vocab-parallel
  (`word_embeddings`): dim 0. QKV needs nothing special: its per-group interleaving keeps
  whole query groups on each rank.
* `linear_fc1` with SwiGLU is the trap: each rank holds ``[gate_r; up_r]``, not a contiguous
  slice of ``[gate; up]`` (megatron's `apply_swiglu_sharded_factory` stores it that way).
* row-parallel (`linear_proj`, `linear_fc2`): dim 1.
* norms and task heads (`task_head.*`, a few small linear layers): replicated; merging checks the copies are identical instead of picking one blindly.
"""
from __future__ import annotations

from typing import List, Sequence

import torch

_DIM0 = ("embedding.word_embeddings.weight", "output_layer.weight",
         "self_attention.linear_qkv.weight", "mlp.linear_fc1.weight")
_DIM1 = ("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")
_REPLICATED = ("layernorm.weight", "layer_norm_weight")  # input_/pre_mlp_/final_layernorm, TE fused
_REPLICATED_HEADS = ("task_head.",)  # classification / span heads: plain (replicated) linear layers


def tp_partition_dim(name: str) -> int | None:
    """The dim megatron shards `name` along under TP (0 or 1), or None when it is replicated."""
    if name.endswith(_DIM0):
        return 0
    if name.endswith(_DIM1):
        return 1
    if name.endswith(_REPLICATED) or name.startswith(_REPLICATED_HEADS):
        return None
    raise ValueError(f"no tensor-parallel rule for {name!r}: not a BiGLM weight "
                     f"(known suffixes: {_DIM0 + _DIM1 + _REPLICATED})")


def _is_glu_fc1(name: str, gated_fc1: bool) -> bool:
    return gated_fc1 and name.endswith("mlp.linear_fc1.weight")


def split_for_tp(name: str, tensor: torch.Tensor, tp_size: int, *, gated_fc1: bool = True) -> List[torch.Tensor]:
    """The `tp_size` local shards megatron rank r holds for the full tensor `name`."""
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    dim = tp_partition_dim(name)
    if dim is None:
        return [tensor.clone() for _ in range(tp_size)]
    parts = 2 if _is_glu_fc1(name, gated_fc1) else 1
    if tensor.shape[dim] % (parts * tp_size):
        raise ValueError(
            f"{name}: dim {dim} of size {tensor.shape[dim]} does not split into {tp_size} equal "
            "tensor-parallel shards" + (" per gate/up half" if parts == 2 else "")
            + "; choose a TP size that divides it (the vocab needs padding to a multiple of TP)")
    if parts == 1:
        return [s.clone() for s in torch.chunk(tensor, tp_size, dim=dim)]
    gate, up = torch.chunk(tensor, 2, dim=0)
    return [torch.cat([g, u], dim=0)
            for g, u in zip(torch.chunk(gate, tp_size), torch.chunk(up, tp_size))]


def merge_tp_shards(name: str, shards: Sequence[torch.Tensor], *, gated_fc1: bool = True) -> torch.Tensor:
    """The full tensor `name` from the local shards of TP ranks 0..n-1 (inverse of `split_for_tp`)."""
    if not shards:
        raise ValueError(f"{name}: no shards given")
    dim = tp_partition_dim(name)
    if dim is None:
        for rank, shard in enumerate(shards[1:], start=1):
            if not torch.equal(shard, shards[0]):
                raise ValueError(f"{name} is replicated across tensor-parallel ranks, but rank {rank}'s "
                                 "copy differs from rank 0's: the checkpoint is inconsistent")
        return shards[0].clone()
    if not _is_glu_fc1(name, gated_fc1):
        return torch.cat(list(shards), dim=dim)
    halves = [torch.chunk(s, 2, dim=0) for s in shards]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
