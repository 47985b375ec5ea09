"""Step time from the FLOPs `training/flops.py` counts, at an MFU that is measured (a device
run's JSON) or assumed, plus what the MFU does not hold: the pipeline bubble (PP−1)/m, the
recompute's extra forward, TP's all-reduces and the DP communication not hidden behind backward.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from megatron_biglm.model.shape import shape_of
from megatron_biglm.training.flops import forward_flops

from .errors import PlanError
from .gpus import GPU
from .layout import Layout
from .static_memory import stage_params
from .workload import Workload

#: the MFU assumed when none is given: about what ~1-3B megatron runs reach on A100 in bf16
DEFAULT_MFU = 0.40
#: hardware work relative to fwd+bwd: full recompute adds a forward, selective the attention core
RECOMPUTE_FACTOR = {"none": 1.0, "selective": 1.03, "full": 4.0 / 3.0}


@dataclass(frozen=True)
class MFU:
    value: float
    source: str  # "measured (FILE)" or "assumed"


def read_measured(path) -> MFU:
    """The MFU of a device run: a JSON with `mfu` (0-1), or `step_s`, `flops_per_step`,
    `num_devices` and `peak_tflops`."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise PlanError(f"--measured {path}: cannot read it as JSON ({exc})") from None
    if isinstance(doc, dict) and isinstance(doc.get("mfu"), (int, float)) and 0 < doc["mfu"] <= 1:
        return MFU(float(doc["mfu"]), f"measured ({path})")
    keys = ("step_s", "flops_per_step", "num_devices", "peak_tflops")
    if isinstance(doc, dict) and all(isinstance(doc.get(k), (int, float)) for k in keys):
        value = doc["flops_per_step"] / doc["step_s"] / doc["num_devices"] / (doc["peak_tflops"] * 1e12)
        return MFU(value, f"measured ({path})")
    raise PlanError(f"--measured {path}: needs 'mfu' (0-1) or all of {list(keys)}")


@dataclass(frozen=True)
class StepTime:
    flops_per_step: float
    compute_s: float
    bubble: float
    tp_comm_s: float
    dp_comm_s: float   # not hidden behind the backward pass
    step_s: float
    tokens_per_s: float


def step_time(w: Workload, layout: Layout, gpu: GPU, gpus_per_node: int, mfu: MFU) -> StepTime:
    shape = shape_of(w.model)
    tokens = layout.global_batch * w.seq_length
    pairs_full = layout.global_batch * w.seq_length ** 2

    flops = 3.0 * forward_flops(shape, tokens, int(pairs_full * w.pair_fraction),
                                int(tokens * w.predicted_fraction))
    peak = gpu.bf16_tflops * 1e12
    compute = flops / (layout.world * peak * mfu.value) * RECOMPUTE_FACTOR[layout.recompute]
    bubble = (layout.pp - 1) / layout.micro_batches
    e = w.dtype_bytes
    tp_comm = 0.0
    if layout.tp > 1:  # 2 all-reduces forward, 2 backward per layer, of [b·s, h] on each rank
        per_rank_tokens = tokens / layout.dp
        volume = 4 * (w.model.num_layers / layout.pp) * per_rank_tokens * w.model.hidden_size * e
        tp_bw = gpu.network_gbps if layout.tp > gpus_per_node else gpu.nvlink_gbps
        tp_comm = volume * 2 * (layout.tp - 1) / layout.tp / (tp_bw * 1e9)
    dp_comm = 0.0
    if layout.dp > 1:
        n = sum(p.numel for p in stage_params(w, layout.tp, layout.pp, 0))
        bw = (gpu.network_gbps if layout.world > gpus_per_node else gpu.nvlink_gbps) * 1e9
        # fp32 gradients reduce-scattered (all-reduced without distopt) and bf16 params gathered
        grad_bytes = n * 4 * (1 if layout.distributed_optimizer else 2)
        gather = n * e if layout.distributed_optimizer else 0
        total = (grad_bytes + gather) * (layout.dp - 1) / layout.dp / bw
        hidden = 0.0
        if w.overlap_grad_reduce:  # all but the last bucket overlaps the backward pass
            hidden = max(0.0, total - total * min(1.0, max(40e6, 1e6 * layout.dp) / max(n, 1)))
        dp_comm = total - hidden
    step = compute * (1 + bubble) + tp_comm * (1 + bubble) + dp_comm
    return StepTime(flops, compute, bubble, tp_comm, dp_comm, step, tokens / step)
