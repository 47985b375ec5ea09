"""The GPU acceptance benchmark's dry run, section by section, on CPU with tiny shapes.

Runs `benchmarks.bench_gpu.main(["--dry-run", ...])` in-process and checks what it writes.
Timings are not checked (benchmarks are not tests); the whole run through
`benchmarks/device_run.sh --dry-run` is in test_device_run.py.
"""
from __future__ import annotations

import json

import pytest

from benchmarks import bench_gpu


def test_bench_gpu_sections_keep_their_order_and_write_as_they_go(tmp_path):
    """`--sections` in any order runs in priority order; the JSON holds only what ran."""
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path), "--sections", "parity", "attention"]) == 0
    results = json.loads((tmp_path / bench_gpu.JSON_NAME).read_text())
    assert list(results["sections"]) == ["attention", "parity"]
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
    (row,) = results["throughput"]["presets"]
    like, trained = row["like_for_like"], row["as_trained"]
    assert like["ours"]["step_flops"] == like["reference"]["step_flops"] == trained["reference"]["step_flops"]
    assert trained["ours"]["step_flops"] < trained["reference"]["step_flops"]
    assert like["loss_diff"] < 1e-4 and trained["loss_diff"] < 1e-4
    peak = results["meta"]["peak_tflops"] * 1e12
    for side in (like["ours"], like["reference"], trained["ours"]):
        assert side["mfu"] == pytest.approx(side["step_flops"] / side["step_s"] / peak)
        assert side["mfu_counts"] == "forward+backward"
