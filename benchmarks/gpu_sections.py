"""The GPU run's sections, in the order a user pays for them, with their time budgets.

Each section runs under its own budget (gpu_guard.py); the device budgets add up to the
benchmark's share of the prepared call (benchmarks/device_run.sh: 300 s of 420 s), so the
call ends with time for a second call that resumes what is missing. `--budget-s` scales them
(a total) or sets one (`NAME=SECONDS`); `--sections` picks some, always in this order.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    name: str
    what: str
    budget_s: float            # on the device
    dry_budget_s: float        # in the CPU dry run (tiny shapes, one thread, a shared machine)
    requires: tuple = ()       # optional packages: missing -> "skipped: <package> not installed"
    headlines: tuple = ()      # top-level keys this section provides


SECTIONS = (
    Section("attention", "split attention against plain, fwd+bwd", 25, 120, headlines=("split_vs_plain",)),
    Section("train", "136M train step, loop against its bare twin", 80, 300, headlines=("train_loop_vs_bare",)),
    Section("mfu", "1.3B train-step MFU through the loop", 60, 300, headlines=("train_step_mfu",)),
    Section("longform", "exact cache, long-form against canvas", 40, 180,
            headlines=("longform_cached_vs_canvas", "longform_identical")),
    Section("eval", "eval prefix cache on against off", 35, 180, requires=("lm_eval",),
            headlines=("eval_cache_speedup",)),
    Section("generation", "Mask-Predict against AR", 30, 180, requires=("transformers",),
            headlines=("mask_predict_vs_ar",)),
    Section("serve", "16 concurrent served requests against sequential", 30, 180,
            requires=("fastapi", "uvicorn", "openai", "requests"), headlines=("serve_concurrent_vs_sequential",)),
)
# run only when named
OPTIONAL = (
    Section("parity", "bf16 split kernels against fp32 sdpa", 20, 120),
    Section("throughput", "fwd+bwd against EuroBertForMaskedLM", 60, 300, requires=("transformers",)),
)
BY_NAME = {s.name: s for s in SECTIONS + OPTIONAL}
ORDER = tuple(BY_NAME)
DEFAULT = tuple(s.name for s in SECTIONS)


def budgets(names, overrides, dry_run: bool) -> dict:
    """{section: seconds} for `names`: each section's default, scaled so the defaults sum to a
    bare number in `overrides` (a total), then `NAME=SECONDS` entries set one section each."""
    base = {n: (BY_NAME[n].dry_budget_s if dry_run else BY_NAME[n].budget_s) for n in names}
    total = [float(o) for o in overrides if "=" not in o]
    if total:
        scale = total[-1] / max(sum(base.values()), 1e-9)
        base = {n: b * scale for n, b in base.items()}
    for item in overrides:
        if "=" in item:
            name, _, value = item.partition("=")
            if name not in BY_NAME:
                raise ValueError(f"--budget-s {item}: no section {name!r}; sections: {', '.join(ORDER)}")
            base[name] = float(value)
    return base


def parse_injection(items) -> dict:
    """`--inject-failure SECTION[:hang]` -> {section: "raise" | "hang"}."""
    out = {}
    for item in items:
        name, _, how = item.partition(":")
        if name not in BY_NAME or how not in ("", "raise", "hang"):
            raise ValueError(f"--inject-failure {item}: expected SECTION or SECTION:hang, sections: {', '.join(ORDER)}")
        out[name] = how or "raise"
    return out
