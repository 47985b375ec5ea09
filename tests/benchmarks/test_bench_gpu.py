"""The GPU acceptance benchmark's dry run: every phase on CPU with tiny shapes.

Runs `benchmarks.bench_gpu.main(["--dry-run", "--out", tmp])` in-process and checks what it
writes: every section present with finite numbers, and the markdown table listing each
kernel, preset, phase and goal. Timings are not checked (benchmarks are not tests).
"""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import bench_gpu


def _numbers(obj):
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _numbers(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in _numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


HEADLINES = ("train_step_mfu", "train_loop_vs_bare", "split_vs_plain", "longform_cached_vs_canvas",
             "longform_identical", "eval_cache_speedup", "serve_concurrent_vs_sequential")


@pytest.mark.slow
def test_bench_gpu_dry_run_writes_every_section(tmp_path, capsys):
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / bench_gpu.JSON_NAME).read_text())
    assert results["meta"]["sections_done"] == list(bench_gpu.SECTIONS)  # in priority order
    for section in ("meta", *bench_gpu.SECTIONS, "goals"):
        assert results[section], section
        numbers = _numbers(results[section])
        assert numbers and all(math.isfinite(n) for n in numbers), section
    assert results["meta"]["dry_run"] is True and results["meta"]["command"].startswith("python -m benchmarks gpu")
    for key in HEADLINES:
        assert key in results, key
    assert results["longform_identical"] is True

    (train,) = results["train"]["presets"]  # the dry run's one stand-in preset, through the real loop
    assert train["loop"]["tokens_per_s"] > 0 and train["bare"]["tokens_per_s"] > 0
    assert math.isfinite(train["loop"]["loss"]) and "optimizer" in train["mfu_counts"]
    assert results["train_loop_vs_bare"] == train["loop"]["tokens_per_s"] / train["bare"]["tokens_per_s"]
    assert results["train_step_mfu"] == train["loop"]["mfu"] > 0
    assert results["split_vs_plain"] == results["attention"]["split_vs_full_fwdbwd"] > 0
    assert results["attention"]["reps"] == 2 and "sdpa_split" in results["attention"]["split"]
    fastest = results["attention"]["fastest_split_kernel"]
    assert results["attention"]["split"][fastest]["fwdbwd_ms"] == min(
        r["fwdbwd_ms"] for r in results["attention"]["split"].values() if r["fwdbwd_ms"] is not None)
    for run in results["longform"]["runs"]:
        assert run["identical"] and run["lengths_ok"] and run["first_difference"] == [None] * run["batch"]
    assert results["longform"]["backend"] == "megatron" and "slot pool" in results["longform"]["meta"]["cache"]
    assert results["longform_cached_vs_canvas"] == min(r["cached_vs_canvas"] for r in results["longform"]["runs"])
    assert results["eval_cache_speedup"] == min(r["speedup"] for r in results["eval"]["rules"].values())

    kernels = results["parity"]["kernels"]
    assert {"local", "sdpa", "flex", "sdpa_split"} <= set(kernels) and all(k["ok"] for k in kernels.values())
    assert all(k["out_rel_err"] <= results["parity"]["tolerance"] for k in kernels.values())
    assert "dq_rel_err" in kernels["sdpa"] and "dq_rel_err" in kernels["local"]
    # each kernel gets its own gradients: the explicit-softmax kernel rounds differently from
    # sdpa, so its error is small but never exactly 0 (shared leaves would make it 0)
    assert all(0 < kernels["local"][f"{g}_rel_err"] <= 1e-4 for g in ("dq", "dk", "dv"))
    assert results["generation"]["mask_predict_vs_ar"] > 0
    assert results["eval"]["rules"]["hf:pll"]["max_score_diff"] < 1e-4
    assert results["eval"]["rules"]["megatron(pool):pll"]["max_score_diff"] < 1e-4
    serve = results["serve"]
    assert serve["same_outputs"] is True and serve["requests"] == 8 and serve["clients"] == 4
    assert results["serve_concurrent_vs_sequential"] == serve["ratio"] > 0
    assert [g["goal"] for g in results["goals"]] == [g for g, _, _ in bench_gpu.goal_rows(results)]

    table = (tmp_path / bench_gpu.MD_NAME).read_text()
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    sections = {line.split("|")[1].strip() for line in rows[1:]}
    assert sections == {*bench_gpu.SECTIONS, "goal"}
    for kernel in kernels:
        assert any(f"| parity | {kernel} vs" in line for line in rows), kernel
    assert any("tiny b=2 s=128" in line and "training-step MFU" in line for line in rows)
    assert sum(line.startswith("| goal |") for line in rows) == len(bench_gpu.GOALS)


def test_bench_gpu_sections_keep_their_order_and_write_as_they_go(tmp_path):
    """`--sections` in any order runs in priority order; the JSON holds only what ran."""
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path), "--sections", "parity", "attention"]) == 0
    results = json.loads((tmp_path / bench_gpu.JSON_NAME).read_text())
    assert results["meta"]["sections_done"] == ["attention", "parity"]
    assert "train" not in results and "train_step_mfu" not in results and "split_vs_plain" in results


def test_peak_is_looked_up_by_the_full_device_name():
    from megatron_biglm.training.flops import peak_tflops_for

    assert peak_tflops_for("NVIDIA H100 80GB HBM3") == ("H100", 989.0)
    assert peak_tflops_for("NVIDIA H100 PCIe") == ("H100 PCIe", 756.0)
    assert peak_tflops_for("NVIDIA H100 NVL") == ("H100 NVL", 835.0)
    assert peak_tflops_for("NVIDIA A100-SXM4-80GB") == ("A100", 312.0)  # not the A10's
    assert peak_tflops_for("NVIDIA H200") == ("H200", 989.0)
    assert peak_tflops_for("Some CPU") is None


def test_bench_gpu_throughput_rows_count_each_sides_own_work(tmp_path):
    """Like-for-like: the same kernel and head on both sides, the same FLOPs, the same loss;
    as-trained: our split kernel and sparse head count less work than the reference's."""
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path), "--sections", "throughput"]) == 0
    results = json.loads((tmp_path / bench_gpu.JSON_NAME).read_text())
    (row,) = results["throughput"]
    like, trained = row["like_for_like"], row["as_trained"]
    assert like["ours"]["step_flops"] == like["reference"]["step_flops"] == trained["reference"]["step_flops"]
    assert trained["ours"]["step_flops"] < trained["reference"]["step_flops"]
    assert like["loss_diff"] < 1e-4 and trained["loss_diff"] < 1e-4
    peak = results["meta"]["peak_tflops"] * 1e12
    for side in (like["ours"], like["reference"], trained["ours"]):
        assert side["mfu"] == pytest.approx(side["step_flops"] / side["step_s"] / peak)
        assert side["mfu_counts"] == "forward+backward"
