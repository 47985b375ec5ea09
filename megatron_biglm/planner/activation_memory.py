"""Bytes one micro-batch's forward keeps for backward on one rank, tensor by tensor as BiGLM's
layers save them (T = micro-batch × sequence tokens, e = bytes of the compute dtype, heads,
groups and FFN per TP rank):

- each RMSNorm (it computes in fp32): its input and the normalised rows in fp32, and one rstd
  per token (2·T·h·4 + 4·T);
- the QKV projection's input (T·h·e); the rotated q and k and the QKV output that v views
  (T·(2·n_q + 3·n_kv)·d·e);
- attention: its output and one fp32 log-sum-exp per query and head (T·n_q·d·e + 4·T·n_q); the
  `sdpa` backend also keeps its dense [b, 1, s, s] masks ((1 + TP)·b·s²·e, measured, shared by the layers, and
  not kept when the attention is recomputed; the split kernels keep none, no s×s);
- the output projection's input (T·n_q·d·e);
- the MLP: fc1's input (T·h·e), SwiGLU's [gate; up] and activation, fc2's input (4·T·f·e).

Selective recompute drops what the core attention keeps and recomputes it; full recompute keeps
each layer's input only (and one fp32 RoPE table they share); otherwise the layers share one set
of RoPE tables (cos and two signed sines, 3·s·d·e: built once per angle tensor, `patches/rope_one_pass.py`).
The first stage adds the token ids; the last adds the final norm and the
fused loss over the predicted rows (their gathered hidden states, targets, log-sum-exp; one
`[chunk, vocab]` fp32 block lives only inside a chunk and is not kept; under TP the
vocabulary-parallel loss keeps each row's fp32 softmax shard). Sequence parallelism
splits the h-sized tensors over TP.
"""
from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout
from .workload import SPLIT_KERNELS, Workload


@dataclass(frozen=True)
class Activations:
    per_microbatch: int   # bytes one micro-batch keeps on this stage
    in_flight: int        # micro-batches alive at once under 1F1B on this stage
    transient: int        # the largest working buffer a backward or the loss needs at once

    @property
    def total(self) -> int:
        return self.per_microbatch * self.in_flight + self.transient


def layer_bytes(w: Workload, layout: Layout, micro_batch: int) -> int:
    """One transformer layer's saved bytes for one micro-batch on one TP rank."""
    mc = w.model
    t, s, e = layout.tp, w.seq_length, w.dtype_bytes
    T = micro_batch * s
    h, d = mc.hidden_size, mc.head_dim
    nq, nkv, f = mc.num_attention_heads // t, mc.query_groups // t, mc.ffn_hidden_size // t
    hs = h // t if layout.sequence_parallel else h   # h-sized tensors, split under SP
    if layout.recompute == "full":
        return T * hs * e
    norms = 2 * norm_bytes(T // (t if layout.sequence_parallel else 1), h)
    qkv_in = T * h * e
    qk_rot = T * (2 * nq + 3 * nkv) * d * e
    core = T * nq * d * e + 4 * T * nq
    if layout.recompute == "selective":
        core = 0
    proj_in = T * nq * d * e
    mlp = T * h * e + 4 * T * f * e
    return norms + qkv_in + qk_rot + core + proj_in + mlp


def norm_bytes(tokens: int, h: int) -> int:
    """An RMSNorm computes in fp32: its input and normalised rows in fp32, one rstd a token."""
    return 2 * tokens * h * 4 + 4 * tokens


def stage_bytes(w: Workload, layout: Layout, stage: int, micro_batch: int, predicted_rows: int) -> int:
    """A stage's saved bytes for one micro-batch with `predicted_rows` rows reaching the head."""
    mc = w.model
    e, T = w.dtype_bytes, micro_batch * w.seq_length
    total = layout_layers(w, layout) * layer_bytes(w, layout, micro_batch)
    if layout.recompute == "full":
        total += w.seq_length * mc.head_dim * 4  # the RoPE table every checkpointed layer shares
    else:
        total += 3 * w.seq_length * mc.head_dim * e  # the RoPE tables the layers share (cos, two signed sines)
    if w.attention_backend not in SPLIT_KERNELS and layout.recompute == "none":
        # sdpa's dense masks, shared by the layers: 2 copies at TP 1, 3 at TP 2, as measured on CPU
        total += (1 + layout.tp) * micro_batch * w.seq_length ** 2 * e
    if stage == 0:
        total += T * 8  # token ids (embedding)
    if stage == layout.pp - 1:
        total += norm_bytes(T, mc.hidden_size)  # final norm
        total += predicted_rows * (mc.hidden_size * e + 8 + 8 + 4 + 4)
        if layout.tp > 1:  # the vocabulary-parallel loss keeps its rows' fp32 softmax shard and a flag
            total += predicted_rows * (mc.padded_vocab_size // layout.tp * 4 + 1)
    return total


def layout_layers(w: Workload, layout: Layout) -> int:
    return w.model.num_layers // layout.pp


def activations(w: Workload, layout: Layout, stage: int) -> Activations:
    """Activations of `stage`: per micro-batch (the peak share of predicted rows), times the
    micro-batches 1F1B keeps in flight there (PP − stage, at most the step's micro-batches),
    plus the loss chunk's fp32 logits and their gradient on the last stage."""
    rows = int(round(w.predicted_fraction_peak * layout.micro_batch * w.seq_length))
    per = stage_bytes(w, layout, stage, layout.micro_batch, rows)
    in_flight = min(layout.pp - stage, layout.micro_batches)
    transient = 0
    if stage == layout.pp - 1:
        transient = 2 * min(w.loss_chunk, rows) * (w.model.padded_vocab_size // layout.tp) * 4
    return Activations(per_microbatch=per, in_flight=in_flight, transient=transient)
