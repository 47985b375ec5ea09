"""Every layout for a GPU count, planned: those that fit ranked by predicted tokens/s, and the
near misses with the reason each fails."""
from __future__ import annotations

from .layout import RECOMPUTE, Layout, valid_tp
from .plan import Plan, plan_layout


def candidate_layouts(w, world: int, gpus_per_node: int, global_batch: int, distopt_choices=(True, False)):
    mc = w.model
    for tp in valid_tp(mc.num_attention_heads, mc.query_groups, gpus_per_node):
        for pp in (p for p in range(1, mc.num_layers + 1) if mc.num_layers % p == 0):
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if global_batch % dp:
                continue
            per_rank = global_batch // dp
            for mbs in (m for m in range(1, per_rank + 1) if per_rank % m == 0):
                for recompute in RECOMPUTE:
                    for distopt in distopt_choices:
                        yield Layout(tp, pp, dp, mbs, global_batch, recompute, distopt)


def rank_key(plan: Plan):
    """Fastest first; on a tie the larger micro-batch, less recompute, smaller TP and PP."""
    l = plan.layout
    return (-round(plan.time.tokens_per_s, 6), -l.micro_batch, RECOMPUTE.index(l.recompute), l.tp, l.pp,
            not l.distributed_optimizer)


def search_layouts(w, world, gpus_per_node, global_batch, gpu, mfu, tokens, distopt_choices=(True, False)):
    """(fitting plans ranked, near misses: the failing plans that need least memory)."""
    plans = [plan_layout(w, l, gpu, gpus_per_node, mfu, tokens)
             for l in candidate_layouts(w, world, gpus_per_node, global_batch, distopt_choices)]
    fits = sorted((p for p in plans if p.fits), key=rank_key)
    misses = sorted((p for p in plans if not p.fits), key=lambda p: (p.peak, rank_key(p)))
    return fits, misses


def nearest_fit(plan: Plan, fits: list[Plan]) -> Plan | None:
    """The fitting layout closest to `plan`'s: fewest changed fields, then fastest."""
    if not fits:
        return None
    l = plan.layout

    def distance(p):
        o = p.layout
        return (sum(getattr(o, f) != getattr(l, f) for f in ("tp", "pp", "micro_batch", "recompute",
                                                            "distributed_optimizer")), rank_key(p))
    return min(fits, key=distance)
