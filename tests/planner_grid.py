"""The activation grid the planner is checked on: cells and the planner's prediction per cell."""
from __future__ import annotations

import itertools

from planner_measure import run_config

#: (seq, micro-batch, recompute, backend, precision) per TP size
GRID = list(itertools.product((64, 128), (1, 3), ("none", "selective", "full"), ("sdpa", "sdpa_split"),
                              ("fp32", "bf16")))


def predicted_rows(seq: int) -> int:
    return seq // 4


def prediction(seq, mbs, tp, recompute, backend, precision, rows) -> int:
    from megatron_biglm.planner.activation_memory import stage_bytes
    from megatron_biglm.planner.layout import Layout
    from megatron_biglm.planner.workload import workload_from_config

    cfg = run_config({"attention_backend": backend}, **{"training.precision": precision, "data.seq_length": seq})
    w = workload_from_config(cfg, on_gpu=False)
    layout = Layout(tp=tp, pp=1, dp=1, micro_batch=mbs, global_batch=mbs, recompute=recompute)
    return stage_bytes(w, layout, 0, mbs, rows * mbs)
