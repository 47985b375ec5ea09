"""The ablation benchmark's whole pipeline at toy size: 3 variants x 2 seeds, a few steps each.

Checks the table's shape (every metric for every variant, n = 2 seeds, a finite CI), that each
row's numbers come from its own checkpoint (recomputed from that export they agree, and they
differ between checkpoints), and the confidence interval against a hand computation.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import bench_fidelity
from megatron_biglm.cli import quickstart

pytestmark = pytest.mark.slow


def test_ci95_is_student_t():
    mean, half = bench_fidelity.ci95([1.0, 2.0, 4.0])
    sd = math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    assert mean == pytest.approx(7 / 3) and half == pytest.approx(4.303 * sd / math.sqrt(3))
    assert math.isnan(bench_fidelity.ci95([3.0])[1])


def test_fidelity_pipeline_at_toy_size(tmp_path, capsys):
    out = tmp_path / "fidelity"
    assert bench_fidelity.main(["--out", str(out), "--steps", "4", "--seeds", "1", "2", "--max-plays", "6",
                                "--questions", "8", "--windows", "6", "--prompts", "3"]) == 0
    results = json.loads((out / bench_fidelity.RESULTS_NAME).read_text())
    assert (out / bench_fidelity.PLOT_NAME).stat().st_size > 10_000
    rows = results["rows"]
    assert sorted((r["variant"], r["seed"]) for r in rows) == sorted(
        (v, s) for v in bench_fidelity.VARIANTS for s in (1, 2))
    assert len({r["checkpoint"] for r in rows}) == len(rows)
    for metric in bench_fidelity.METRICS:
        for variant in bench_fidelity.VARIANTS:
            cell = results["table"][metric][variant]
            assert cell["n"] == 2 and math.isfinite(cell["mean"]) and math.isfinite(cell["ci95"])
            values = [r["metrics"][metric] for r in rows if r["variant"] == variant]
            assert cell["mean"] == pytest.approx(sum(values) / 2)
    # each number is its own checkpoint's: recomputed from the row's export it agrees ...
    row = next(r for r in rows if r["variant"] == "no_attn" and r["seed"] == 2)
    adapter, tokenizer = bench_fidelity.load(row["hf_dir"], row["variant"])
    held_out = quickstart.held_out_documents(Path(results["meta"]["corpus"]))
    windows = bench_fidelity.held_out_windows(tokenizer, held_out, 6)
    again = bench_fidelity.masked_nll(adapter, windows, 0, round(0.15 * bench_fidelity.WINDOW), 2)
    assert again == pytest.approx(row["metrics"]["mlm_nll_0.15"], rel=1e-6)
    # ... and differs from every other checkpoint's
    others = [r["metrics"]["mlm_nll_0.15"] for r in rows if r is not row]
    assert all(abs(v - again) > 1e-6 for v in others)
    table = capsys.readouterr().out
    assert all(f"| {m} |" in table for m in bench_fidelity.METRICS)
