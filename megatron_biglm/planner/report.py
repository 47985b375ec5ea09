"""A plan as text (a table per stage, then the time) and as JSON for scripts."""
from __future__ import annotations

from .plan import Plan

GIB = 1024 ** 3
_PARTS = (("weights", "weights (model dtype)"), ("main_weights", "fp32 main weights"),
          ("grads", "fp32 gradient buffer (padded)"), ("optimizer", "optimizer states"),
          ("activations", "activations"), ("buffers", "communication buffers"),
          ("reserve", "reserve (allocator, CUDA context)"))


def as_json(plan: Plan, nearest: Plan | None = None) -> dict:
    l = plan.layout
    out = dict(
        fits=plan.fits, gpu=plan.gpu.name, gpu_memory_bytes=plan.gpu.memory_bytes,
        layout=dict(tp=l.tp, pp=l.pp, dp=l.dp, micro_batch=l.micro_batch, global_batch=l.global_batch,
                    micro_batches=l.micro_batches, recompute=l.recompute,
                    distributed_optimizer=l.distributed_optimizer, sequence_parallel=l.sequence_parallel,
                    world=l.world),
        stages=[dict(stage=s.stage, microbatches_in_flight=s.microbatches_in_flight, memory_bytes=s.as_dict())
                for s in plan.stages],
        flops_per_step=plan.time.flops_per_step, step_s=plan.time.step_s, tokens_per_s=plan.time.tokens_per_s,
        bubble=plan.time.bubble, tp_comm_s=plan.time.tp_comm_s, dp_comm_unoverlapped_s=plan.time.dp_comm_s,
        mfu=plan.mfu.value, mfu_source="measured" if plan.mfu.source.startswith("measured") else "assumed",
        tokens=plan.tokens, days=plan.days, gpu_hours=plan.gpu_hours)
    if not plan.fits:
        out["reason"] = plan.reason()
        out["nearest_fit"] = None if nearest is None else as_json(nearest)["layout"]
    return out


def as_text(plan: Plan) -> str:
    l = plan.layout
    lines = [f"layout: {l.describe()} on {l.world} x {plan.gpu.name} ({plan.gpu.memory_gib:g} GiB); "
             f"{l.micro_batches} micro-batches a step"]
    header = f"  {'memory per GPU (GiB)':36s}" + "".join(f"{'stage ' + str(s.stage):>12s}" for s in plan.stages)
    lines.append(header)
    for key, label in _PARTS:
        row = f"  {label:36s}" + "".join(f"{getattr(s, key) / GIB:12.2f}" for s in plan.stages)
        if key == "activations":
            row += "   = " + ", ".join(f"{s.microbatches_in_flight} x {s.activations_per_microbatch / GIB:.2f}"
                                       for s in plan.stages) + " (in flight x per micro-batch)"
        lines.append(row)
    lines.append(f"  {'total':36s}" + "".join(f"{s.total / GIB:12.2f}" for s in plan.stages))
    lines.append(("fits: yes" if plan.fits else "does not fit") +
                 f" (peak {plan.peak / GIB:.1f} of {plan.gpu.memory_gib:g} GiB)")
    t = plan.time
    lines.append(f"time at MFU {plan.mfu.value:.1%} ({plan.mfu.source}): step {t.step_s:.2f} s, "
                 f"{t.tokens_per_s:,.0f} tokens/s; bubble (PP-1)/m = {t.bubble:.1%}; TP comm {t.tp_comm_s:.3f} s, "
                 f"DP comm not overlapped {t.dp_comm_s:.3f} s")
    lines.append(f"{plan.tokens:.3g} tokens: {plan.days:.1f} days, {plan.gpu_hours:,.0f} GPU-hours")
    return "\n".join(lines)


def search_text(fits: list[Plan], misses: list[Plan], top: int) -> str:
    lines = [f"{len(fits)} layouts fit; the fastest {min(top, len(fits))}:"]
    for p in fits[:top]:
        lines.append(f"  {p.time.tokens_per_s:12,.0f} tok/s  peak {p.peak / GIB:5.1f} GiB  {p.layout.describe()}")
    if misses:
        lines.append(f"near misses ({len(misses)} do not fit), the closest {min(top, len(misses))}:")
        for p in misses[:top]:
            lines.append(f"  {p.reason()}")
    return "\n".join(lines)


def presets_markdown(plans: list[tuple[str, Plan]]) -> str:
    """The README's table of the pretraining presets' plans: (preset, plan) rows."""
    lines = ["| preset | nodes x GPUs | layout | memory per GPU (GiB) | tokens/s (MFU) | days to the paper's tokens |",
             "|---|---|---|---|---|---|"]
    for name, p in plans:
        l = p.layout
        lines.append(f"| {name} | {l.world // p.gpus_per_node} x {p.gpus_per_node} {p.gpu.name} | TP={l.tp} PP={l.pp} "
                     f"mbs={l.micro_batch} | {p.peak / GIB:.1f} | {p.time.tokens_per_s:,.0f} ({p.mfu.value:.0%} "
                     f"{p.mfu.source}) | {p.days:.1f} ({p.tokens:.3g} tokens) |")
    return "\n".join(lines)
