"""Weights, main weights, gradient buffer and optimizer states of one rank, counted the way
megatron-core allocates them.

megatron DDP puts a stage's parameters (in reverse order) into one fp32 gradient buffer
(`grad_reduce_in_fp32`), cut into buckets of `bucket_size` elements when the reduction
overlaps the backward pass (one bucket otherwise, and on every pipeline stage after the
first). With the distributed optimizer each parameter starts at a multiple of 64 elements,
each bucket ends at a multiple of lcm(DP, 128), a tied embedding (PP > 1) has a bucket of its
own, and the weights move into a parameter buffer of the same padded length; each DP rank then
owns 1/DP of every bucket and keeps fp32 main weights (bf16 runs) and Adam's two moments only
for the parameters inside its shard. Without it, every rank keeps fp32 main weights (bf16 runs)
and both moments for all its parameters. torch's Adam also keeps one fp32 `step` per parameter.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .layout import Layout
from .workload import DEFAULT_BUCKET, Workload


@dataclass(frozen=True)
class Param:
    name: str
    numel: int
    shared_embedding: bool = False


def stage_params(w: Workload, tp: int, pp: int, stage: int) -> list[Param]:
    """This stage's parameters on one TP rank, in megatron's `named_parameters` order."""
    mc = w.model
    h, d, f = mc.hidden_size, mc.head_dim, mc.ffn_hidden_size
    vocab = mc.padded_vocab_size
    first, last = stage == 0, stage == pp - 1
    tied = not mc.untie_embeddings_and_output_weights
    out: list[Param] = []
    if first:
        out.append(Param("embedding.word_embeddings.weight", vocab // tp * h, shared_embedding=tied and pp > 1))
    per_stage = mc.num_layers // pp
    qkv = (mc.num_attention_heads + 2 * mc.query_groups) * d // tp
    for i in range(per_stage):
        p = f"decoder.layers.{i}."
        out += [Param(p + "input_layernorm.weight", h),
                Param(p + "self_attention.linear_proj.weight", h * mc.num_attention_heads * d // tp),
                Param(p + "self_attention.linear_qkv.weight", qkv * h),
                Param(p + "pre_mlp_layernorm.weight", h),
                Param(p + "mlp.linear_fc1.weight", 2 * f // tp * h),
                Param(p + "mlp.linear_fc2.weight", h * f // tp)]
    if last:
        out.append(Param("decoder.final_layernorm.weight", h))
        if not tied or (pp > 1 and not first):
            out.append(Param("output_layer.weight", vocab // tp * h, shared_embedding=tied))
        if mc.length_head_max > 0:
            out += [Param("length_head.weight", (mc.length_head_max + 1) * h),
                    Param("length_head.bias", mc.length_head_max + 1)]
    return out


@dataclass(frozen=True)
class Buckets:
    """The gradient buffer's layout: (start, end) of each bucket and of each parameter."""
    buckets: list[tuple[int, int]]
    params: list[tuple[int, int]]  # in buffer order (reversed parameter order)

    @property
    def numel(self) -> int:
        return self.buckets[-1][1] if self.buckets else 0


def bucket_size_for(w: Workload, dp: int, stage: int) -> int | None:
    """megatron DDP's bucket: the default when the reduction overlaps, on the first stage only."""
    if not w.overlap_grad_reduce or stage > 0:
        return None
    return max(DEFAULT_BUCKET, 1_000_000 * dp)


def buffer_layout(params: list[Param], dp: int, distopt: bool, bucket_size: int | None) -> Buckets:
    """The buffer megatron's `_ParamAndGradBuffer` builds for `params` (see the module)."""
    def pad(n, k):
        return int(math.ceil(n / k) * k)

    divisor = math.lcm(dp, 128)
    buckets, spans = [], []
    start = bucket_start = 0
    in_bucket = 0
    end = 0

    def close(param_end):
        nonlocal bucket_start, in_bucket
        bucket_end = pad(param_end, divisor) if distopt else param_end
        buckets.append((bucket_start, bucket_end))
        bucket_start, in_bucket = bucket_end, 0
        return bucket_end

    for p in reversed(params):
        if distopt:
            start = pad(start, 64)
        shared = p.shared_embedding and distopt
        if shared and in_bucket:
            start = close(start)
        end = start + p.numel
        spans.append((start, end))
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or shared:
            start = close(end)
        else:
            start = end
    if in_bucket:
        close(end)
    return Buckets(buckets, spans)


def shard_numels(layout_: Buckets, dp: int) -> list[int]:
    """Parameter elements each DP rank owns under the distributed optimizer (padding excluded),
    and how many parameters have a piece there: [(elements, pieces)] per rank."""
    per_bucket = [[(s, e) for s, e in layout_.params if s >= b0 and e <= b1] for b0, b1 in layout_.buckets]
    out = []
    for rank in range(dp):
        owned = pieces = 0
        for (b0, b1), spans in zip(layout_.buckets, per_bucket):
            size = (b1 - b0) // dp
            lo, hi = b0 + rank * size, b0 + (rank + 1) * size
            for s, e in spans:
                n = min(e, hi) - max(s, lo)
                if n > 0:
                    owned += n
                    pieces += 1
        out.append((owned, pieces))
    return out


@dataclass(frozen=True)
class StaticMemory:
    weights: int
    main_weights: int
    grads: int
    optimizer: int
    params: int            # parameters of this rank (unpadded)
    buffer_numel: int      # the padded gradient-buffer length

    @property
    def total(self) -> int:
        return self.weights + self.main_weights + self.grads + self.optimizer


def static_memory(w: Workload, layout: Layout, stage: int, dp_rank: int | None = None) -> StaticMemory:
    """Bytes of one rank of `stage` (the most loaded DP rank when `dp_rank` is None)."""
    params = stage_params(w, layout.tp, layout.pp, stage)
    distopt = layout.distributed_optimizer
    buf = buffer_layout(params, layout.dp, distopt, bucket_size_for(w, layout.dp, stage))
    n_params = sum(p.numel for p in params)
    e = w.dtype_bytes
    bf16 = w.precision == "bf16"
    if distopt:
        shards = shard_numels(buf, layout.dp)
        owned, pieces = max(shards) if dp_rank is None else shards[dp_rank]
        weights = buf.numel * e
    else:
        owned, pieces = n_params, len(params)
        weights = n_params * e
    main = owned * 4 if bf16 else 0
    optimizer = owned * 4 * 2 + pieces * 4
    return StaticMemory(weights=weights, main_weights=main, grads=buf.numel * 4, optimizer=optimizer,
                        params=n_params, buffer_numel=buf.numel)
