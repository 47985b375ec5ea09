"""One layout planned: memory by part for the first and the last pipeline stage (their most
loaded rank), whether it fits the GPU, and the time the run takes."""
from __future__ import annotations

from dataclasses import dataclass

from .activation_memory import activations
from .gpus import GPU
from .layout import Layout, check_layout
from .static_memory import static_memory
from .time_model import MFU, StepTime, step_time
from .workload import Workload

#: the allocator's fragmentation and the CUDA context, kept free on every GPU
RESERVE_FRACTION = 0.06
RESERVE_MIN = 1536 * 1024 ** 2


@dataclass(frozen=True)
class StageMemory:
    stage: int
    weights: int
    main_weights: int
    grads: int
    optimizer: int
    activations_per_microbatch: int
    microbatches_in_flight: int
    activations: int
    buffers: int
    reserve: int

    @property
    def total(self) -> int:
        return (self.weights + self.main_weights + self.grads + self.optimizer + self.activations
                + self.buffers + self.reserve)

    def as_dict(self) -> dict:
        return dict(weights=self.weights, main_weights=self.main_weights, grads=self.grads,
                    optimizer=self.optimizer, activations_per_microbatch=self.activations_per_microbatch,
                    activations=self.activations, buffers=self.buffers, reserve=self.reserve,
                    total=self.total)


@dataclass(frozen=True)
class Plan:
    layout: Layout
    gpu: GPU
    gpus_per_node: int
    stages: list[StageMemory]
    time: StepTime
    mfu: MFU
    tokens: float

    @property
    def peak(self) -> int:
        return max(s.total for s in self.stages)

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu.memory_bytes

    def reason(self) -> str:
        worst = max(self.stages, key=lambda s: s.total)
        gib = 1024 ** 3
        return (f"{self.layout.describe()}: stage {worst.stage} needs {worst.total / gib:.1f} GiB "
                f"of {self.gpu.name}'s {self.gpu.memory_gib:g} GiB (activations {worst.activations / gib:.1f} GiB "
                f"= {worst.microbatches_in_flight} x {worst.activations_per_microbatch / gib:.2f})")

    @property
    def days(self) -> float:
        return self.tokens / self.time.tokens_per_s / 86400

    @property
    def gpu_hours(self) -> float:
        return self.tokens / self.time.tokens_per_s / 3600 * self.layout.world


def comm_buffers(w: Workload, layout: Layout) -> int:
    """Communication buffers: NCCL's per-peer channels on a GPU (about 0.5 GiB with TP or DP
    peers), plus, without the distributed optimizer's buffer, one bucket's all-reduce copy."""
    if w.precision == "fp32" and layout.world == 1:
        return 0
    peers = (layout.tp > 1) + (layout.dp > 1) + (layout.pp > 1)
    return peers * 256 * 1024 ** 2


def plan_layout(w: Workload, layout: Layout, gpu: GPU, gpus_per_node: int, mfu: MFU, tokens: float) -> Plan:
    check_layout(layout, num_layers=w.model.num_layers, num_heads=w.model.num_attention_heads,
                 num_groups=w.model.query_groups, gpus_per_node=gpus_per_node, world=layout.world, batch=False)
    stages = []
    for stage in sorted({0, layout.pp - 1}):
        s = static_memory(w, layout, stage)
        a = activations(w, layout, stage)
        used = s.total + a.total + comm_buffers(w, layout)
        reserve = 0 if gpu.name == "cpu" else max(RESERVE_MIN, int(RESERVE_FRACTION * gpu.memory_bytes))
        stages.append(StageMemory(stage, s.weights, s.main_weights, s.grads, s.optimizer, a.per_microbatch,
                                  a.in_flight, a.total, comm_buffers(w, layout), reserve))
        del used
    return Plan(layout, gpu, gpus_per_node, stages, step_time(w, layout, gpu, gpus_per_node, mfu), mfu, tokens)
