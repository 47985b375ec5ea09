"""The GPU run's headline figures, goals and markdown table, written from whatever sections
produced figures (a failed, overrun or skipped section gets a row saying so)."""
from __future__ import annotations

import math

MD_NAME = "gpu_acceptance.md"
# one H200 or H100, bf16, each against a baseline measured in the same run
GOALS = {"train_step_mfu": 0.50, "train_loop_vs_bare": 0.95, "split_vs_plain": 1.0,
         "longform_cached_vs_canvas": 3.0, "eval_cache_speedup": 2.0, "serve_concurrent_vs_sequential": 8.0}
GOAL_NAMES = {
    "train_step_mfu": "1.3B training-step MFU (fwd+bwd+optimizer+loop, the loop's own count)",
    "train_loop_vs_bare": "136M train(): loop / its bare twin, median step time",
    "split_vs_plain": "split / plain non-causal attention, fwd+bwd, same kernel family",
    "longform_cached_vs_canvas": "long-form exact cache / canvas re-run (smaller over batch 1 and 8)",
    "eval_cache_speedup": "eval prefix cache on / off, 136M (smallest over rules and backends)",
    "serve_concurrent_vs_sequential": "served requests/s, 16 concurrent clients / one after another"}


def summary(results: dict) -> dict:
    """The headline figures of the sections that produced them."""
    out = {}
    train, mfu = results.get("train", {}), results.get("mfu", {})
    if "loop_vs_bare" in train:
        out["train_loop_vs_bare"] = train["loop_vs_bare"]
    if "loop" in mfu:
        out["train_step_mfu"] = mfu["loop"]["mfu"]
    if "split_vs_full_fwdbwd" in results.get("attention", {}):
        out["split_vs_plain"] = results["attention"]["split_vs_full_fwdbwd"]
    runs = results.get("longform", {}).get("runs")
    if runs:
        out["longform_identical"] = all(r.get("identical") is True and r["lengths_ok"] for r in runs)
        out["longform_cached_vs_canvas"] = min(r["cached_vs_canvas"] for r in runs)
    rules = results.get("eval", {}).get("rules")
    if rules:
        out["eval_cache_speedup"] = min(r["speedup"] for r in rules.values())
    if "mask_predict_vs_ar" in results.get("generation", {}):
        out["mask_predict_vs_ar"] = results["generation"]["mask_predict_vs_ar"]
    if "ratio" in results.get("serve", {}):
        out["serve_concurrent_vs_sequential"] = results["serve"]["ratio"]
    return out


def goal_rows(results: dict) -> list[tuple[str, str, float, float]]:
    """(key, goal, measured, target) for each goal whose figure exists."""
    return [(key, GOAL_NAMES[key], results[key], target) for key, target in GOALS.items() if key in results]


def finite_numbers(obj, path: str = "") -> list[str]:
    """Paths of numbers in `obj` that are not finite (NaN or inf)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in finite_numbers(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in finite_numbers(v, f"{path}[{i}]")]
    if isinstance(obj, float) and not math.isfinite(obj):
        return [path]
    return []


def _ms(sec):
    return f"{1e3 * sec:.2f} ms"


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [f"# GPU acceptance: {meta['device']}" + (" (dry run: tiny shapes on CPU)" if meta["dry_run"] else ""),
             "", f"dtype {meta['dtype']}, peak {meta['peak_tflops']:.3g} TFLOP/s ({meta['peak_source']}), "
             f"torch {meta['torch']}, commit {meta['commit']}, command `{meta['command']}`", "",
             "| section | measure | value | goal |", "|---|---|---|---|"]

    def row(section, measure, value, goal=""):
        lines.append(f"| {section} | {measure} | {value} | {goal} |")

    for name, rec in results.get("sections", {}).items():
        counts = ", ".join(f"{k} {rec[k]}" for k in ("graphs", "recompiles", "graph_breaks") if k in rec)
        status = rec["status"] + (f": {rec['error']}" if rec.get("error") else "")
        row(name, f"status ({rec['elapsed_s']:.1f} s of {rec['budget_s']:.0f} s)", status.replace("|", "/"), counts)
    t = results.get("train", {})
    for side in ("loop", "bare"):
        if side in t:
            s = t[side]
            row("train", f"{t['preset']} b={t['batch']} s={t['seq']} {t['precision']} {side}: {s['runs']}",
                f"median step {_ms(s['step_s'])} over {s['steps_timed']} steps, {s['tokens_per_s']:,.0f} tok/s, "
                f"MFU {100 * s['mfu']:.1f} %, recompiles {s.get('recompiles', 'n/a')}")
    if "loop_vs_bare" in t:
        row("train", "loop / bare twin (bare median step / loop median step)", f"{t['loop_vs_bare']:.2f}x")
        for phase, sec in t["loop"].get("phases_s", {}).items():
            row("train", f"loop step, {phase} (median)", _ms(sec))
    m = results.get("mfu", {})
    if "loop" in m:
        row("mfu", f"{m['preset']} b={m['batch']} s={m['seq']} {m['precision']} train() loop",
            f"{m['loop']['tokens_per_s']:,.0f} tok/s, training-step MFU {100 * m['loop']['mfu']:.1f} %")
    a = results.get("attention", {})
    if "full" in a:
        row("attention", f"plain non-causal s={a['seq']} b={a['batch']} fwd / fwd+bwd ({a['timer']}, {a['reps']} reps)",
            f"{a['full']['fwd_ms']:.2f} / {a['full']['fwdbwd_ms']:.2f} ms")
        for kernel, r in a["split"].items():
            bwd = "n/a" if r["fwdbwd_ms"] is None else f"{r['fwdbwd_ms']:.2f}"
            pick = " (auto's pick)" if kernel == a["best_split_kernel"] else ""
            row("attention", f"split {kernel} fwd / fwd+bwd{pick}",
                f"{r['fwd_ms']:.2f} / {bwd} ms")
    for r in results.get("longform", {}).get("runs", []):
        same = "identical" if r.get("identical") else f"DIFFERENT {r.get('first_difference')}"
        row("longform", f"{results['longform']['backend']} batch {r['batch']}: cached / reference / canvas tok/s "
            f"({same}, lengths {'ok' if r['lengths_ok'] else 'SHORT'})",
            " / ".join(f"{r[n]['tokens_per_s']:,.1f}" for n in ("cached", "uncached", "canvas")))
    ev = results.get("eval", {})
    for rule, r in ev.get("rules", {}).items():
        row("eval", f"prefix cache on / off, {ev['preset']}, rule {rule} (median of {ev['reps']})",
            f"{r['speedup']:.2f}x ({r['requests_per_s_off']:.1f} -> {r['requests_per_s_on']:.1f} req/s)")
    gen = results.get("generation", {})
    if "mask_predict_vs_ar" in gen:
        shape = f"{gen['preset']} {gen['dtype']} b={gen['batch']} prompt {gen['prefix']}"
        row("generation", f"Mask-Predict T={gen['steps']} N={gen['new_tokens']}, {gen['mask_predict']}, {shape}",
            f"{gen['mask_predict_tokens_per_s']:,.1f} tok/s")
        row("generation", f"autoregressive ({gen['ar_baseline']}), {shape}", f"{gen['ar_tokens_per_s']:,.1f} tok/s")
    for kernel, r in results.get("parity", {}).get("kernels", {}).items():
        parity = results["parity"]
        errs = ", ".join(f"{k[:-8]} {v:.1e}" for k, v in r.items() if k.endswith("_rel_err"))
        row("parity", f"{kernel} vs fp32 sdpa ({parity['dtype']}, rel. max error)",
            errs + ("" if "backward" not in r else "; backward not run"),
            f"<= {parity['tolerance']:.0e}: {'ok' if r['ok'] else 'FAILED'}")
    sv = results.get("serve", {})
    if "ratio" in sv:
        for name in ("sequential", "concurrent"):
            who = "one after another" if name == "sequential" else f"{sv['clients']} concurrent clients"
            row("serve", f"{sv['requests']} requests, {sv['max_tokens']} tokens, {who}",
                f"{sv[name]['requests_per_s']:.1f} req/s, p50 {sv[name]['p50_s']:.3f} s, p99 {sv[name]['p99_s']:.3f} s")
    for r in results.get("throughput", {}).get("presets", []):
        for kind in ("like_for_like", "as_trained"):
            k = r[kind]
            for name in ("ours", "reference"):
                who = "ours" if name == "ours" else "EuroBertForMaskedLM"
                row("throughput", f"{r['preset']} b={r['batch']} s={r['seq']} {kind.replace('_', '-')} {who} "
                    f"({k['attention']}; {k['head']})",
                    f"{k[name]['tokens_per_s']:,.0f} tok/s, fwd+bwd MFU {100 * k[name]['mfu']:.1f} % of its own FLOPs")
    for key, name, value, target in goal_rows(results):
        row("goal", name, f"{value:.2f}", f">= {target:.2f}: {'met' if value >= target else 'not met'}")
    for key in GOALS:
        if key not in results:
            row("goal", GOAL_NAMES[key], "not measured", f">= {GOALS[key]:.2f}")
    return "\n".join(lines) + "\n"
