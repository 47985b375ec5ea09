"""A parallel layout and its validity for a model and a GPU count."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import PlanError

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    recompute: str = "none"
    distributed_optimizer: bool = True
    sequence_parallel: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step on each data-parallel rank (at least one)."""
        return max(1, self.global_batch // (self.micro_batch * self.dp))

    def with_(self, **changes) -> "Layout":
        return replace(self, **changes)

    def describe(self) -> str:
        sp = " SP" if self.sequence_parallel else ""
        return (f"TP={self.tp} PP={self.pp} DP={self.dp} mbs={self.micro_batch} gbs={self.global_batch} "
                f"recompute={self.recompute} distopt={'on' if self.distributed_optimizer else 'off'}{sp}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def valid_tp(num_heads: int, num_groups: int, gpus_per_node: int) -> list[int]:
    """TP sizes inside one node that divide both the attention heads and the query groups."""
    return [t for t in _divisors(gpus_per_node) if num_heads % t == 0 and num_groups % t == 0]


def check_layout(layout: Layout, *, num_layers: int, num_heads: int, num_groups: int,
                 gpus_per_node: int, world: int, batch: bool = True) -> None:
    """PlanError naming the value and the valid choices for a layout that cannot run
    (`batch`: the batch arithmetic too; its memory can be planned without it). A TP group wider
    than a node can run (its all-reduces cross the network: the time model says what it costs);
    `--search` proposes only TP inside a node (`valid_tp`)."""
    if layout.tp <= 0 or num_heads % layout.tp or num_groups % layout.tp:
        tps = [t for t in _divisors(world) if num_heads % t == 0 and num_groups % t == 0]
        raise PlanError(f"TP={layout.tp} must divide the {num_heads} attention heads and {num_groups} query "
                        f"groups; valid TP: {tps} (inside a node of {gpus_per_node} GPUs: "
                        f"{valid_tp(num_heads, num_groups, gpus_per_node)})")
    pps = _divisors(num_layers)
    if layout.pp not in pps:
        raise PlanError(f"PP={layout.pp} must divide the {num_layers} layers; valid PP: {pps}")
    if world % (layout.tp * layout.pp):
        raise PlanError(f"TP*PP = {layout.tp}*{layout.pp} does not divide the {world} GPUs; valid TP*PP: "
                        f"{[d for d in _divisors(world) if d % layout.tp == 0]}")
    if layout.recompute not in RECOMPUTE:
        raise PlanError(f"recompute={layout.recompute!r}; choose one of {RECOMPUTE}")
    if layout.micro_batch <= 0:
        raise PlanError(f"micro-batch {layout.micro_batch} must be >= 1")
    if batch and layout.global_batch % (layout.micro_batch * layout.dp):
        raise PlanError(f"global batch {layout.global_batch} is not divisible by micro-batch {layout.micro_batch} "
                        f"x DP {layout.dp}; valid micro-batches: "
                        f"{[m for m in _divisors(max(1, layout.global_batch // layout.dp)) if layout.global_batch % (m * layout.dp) == 0]}")
    if layout.sequence_parallel and layout.tp == 1:
        raise PlanError("sequence parallelism needs TP > 1")
