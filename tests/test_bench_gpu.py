"""The GPU acceptance benchmark's dry run: every phase on CPU with tiny shapes.

Runs `benchmarks.bench_gpu.main(["--dry-run", "--out", tmp])` in-process and checks what it
writes: every section present with finite numbers, and the markdown table listing each
kernel, preset, phase and goal. Timings are not checked (benchmarks are not tests).
"""
from __future__ import annotations

import json
import math

from benchmarks import bench_gpu


def _numbers(obj):
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def test_bench_gpu_dry_run_writes_every_section(tmp_path, capsys):
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / bench_gpu.JSON_NAME).read_text())
    for section in ("meta", *bench_gpu.SECTIONS, "goals"):
        assert results[section], section
        numbers = _numbers(results[section])
        assert numbers and all(math.isfinite(n) for n in numbers), section
    assert results["meta"]["dry_run"] is True

    kernels = results["parity"]["kernels"]
    assert {"local", "sdpa", "flex"} <= set(kernels) and all(k["ok"] for k in kernels.values())
    assert all(k["out_rel_err"] <= results["parity"]["tolerance"] for k in kernels.values())
    assert "dq_rel_err" in kernels["sdpa"] and "dq_rel_err" in kernels["local"]
    # each kernel gets its own gradients: the explicit-softmax kernel rounds differently from
    # sdpa, so its error is small but never exactly 0 (shared leaves would make it 0)
    assert all(0 < kernels["local"][f"{g}_rel_err"] <= 1e-4 for g in ("dq", "dk", "dv"))
    (throughput,) = results["throughput"]  # the dry run's one stand-in preset
    for model in ("ours", "reference"):
        assert throughput[model]["tokens_per_s"] > 0 and throughput[model]["mfu"] > 0
    assert throughput["loss_diff"] < 1e-4  # same weights, same batch: same loss
    assert results["attention"]["split_vs_full_fwdbwd"] > 0
    assert results["generation"]["mask_predict_vs_ar"] > 0
    assert results["eval"]["rules"]["hf:pll"]["max_score_diff"] < 1e-4
    assert results["eval"]["rules"]["megatron:pll"]["max_score_diff"] < 1e-4
    assert [g["goal"] for g in results["goals"]] == [g for g, _, _ in bench_gpu.goal_rows(results)]

    table = (tmp_path / bench_gpu.MD_NAME).read_text()
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    sections = {line.split("|")[1].strip() for line in rows[1:]}
    assert sections == {*bench_gpu.SECTIONS, "goal"}
    for kernel in kernels:
        assert any(f"| parity | {kernel} vs" in line for line in rows), kernel
    assert any("tiny b=2 s=128" in line and "MFU" in line for line in rows)
    assert sum(line.startswith("| goal |") for line in rows) == 3
