"""The GPU run's guard, budgets and JSON, without a GPU: a section that raises, overruns or
lacks an optional package is recorded and the next one runs; the JSON is always whole."""
from __future__ import annotations

import json
import time

import pytest

from benchmarks import bench_gpu, gpu_compile_counts, gpu_sections
from benchmarks.gpu_guard import run_guarded
from benchmarks.gpu_results import JSON_NAME, Results, write_atomic


def test_guard_records_a_raise_an_overrun_and_a_missing_package():
    def boom():
        raise ValueError("bad shape")

    def hang():
        while True:
            time.sleep(0.01)

    raised = run_guarded(boom, budget_s=5, counts=gpu_compile_counts)
    assert raised.figures is None and raised.record["status"] == "error"
    assert "ValueError: bad shape" in raised.record["error"] and "boom" in raised.record["traceback"]
    assert {"recompiles", "graph_breaks", "graphs", "elapsed_s"} <= set(raised.record)

    t0 = time.perf_counter()
    overrun = run_guarded(hang, budget_s=0.3)
    assert overrun.record["status"] == "overrun" and "0.3 s" in overrun.record["error"]
    assert 0.3 <= overrun.record["elapsed_s"] < 0.3 + 2 and time.perf_counter() - t0 < 3

    skipped = run_guarded(lambda: {"x": 1}, budget_s=5, requires=("json", "no_such_package_xyz"))
    assert skipped.record["status"] == "skipped"
    assert skipped.record["error"] == "skipped: no_such_package_xyz not installed"

    ok = run_guarded(lambda: {"x": 1}, budget_s=5, requires=("json",))
    assert ok.figures == {"x": 1} and ok.record["status"] == "ok"


def test_a_section_that_swallows_exceptions_still_stops_at_its_budget():
    def stubborn():
        while True:
            try:
                time.sleep(0.01)
            except Exception:  # noqa: BLE001 - what a careless section might do
                pass

    assert run_guarded(stubborn, budget_s=0.2).record["status"] == "overrun"


def test_budgets_scale_to_a_total_then_take_named_overrides():
    names = list(gpu_sections.DEFAULT)
    base = gpu_sections.budgets(names, [], dry_run=False)
    assert list(base) == names and sum(base.values()) <= 300  # the benchmark's share of device_run.sh
    scaled = gpu_sections.budgets(names, ["150", "train=40"], dry_run=False)
    assert scaled["train"] == 40
    assert scaled["attention"] == pytest.approx(base["attention"] * 150 / sum(base.values()))
    with pytest.raises(ValueError, match="no section 'trian'"):
        gpu_sections.budgets(names, ["trian=3"], dry_run=False)
    assert gpu_sections.parse_injection(["eval", "serve:hang"]) == {"eval": "raise", "serve": "hang"}
    with pytest.raises(ValueError, match="SECTION or SECTION:hang"):
        gpu_sections.parse_injection(["eval:explode"])


def test_sections_run_in_the_order_a_user_pays_for():
    assert gpu_sections.DEFAULT == ("attention", "train", "mfu", "longform", "eval", "generation", "serve")
    headlines = {k for s in gpu_sections.SECTIONS for k in s.headlines}
    assert {"train_step_mfu", "train_loop_vs_bare", "split_vs_plain", "longform_cached_vs_canvas",
            "longform_identical", "eval_cache_speedup", "serve_concurrent_vs_sequential"} <= headlines


def test_results_are_written_whole_after_every_row(tmp_path):
    results = Results(tmp_path, {"device": "x"})
    results.row("train", "loop", {"step_s": 0.5})
    assert json.loads((tmp_path / JSON_NAME).read_text())["train"] == {"loop": {"step_s": 0.5}}
    results.finish("train", None, {"status": "overrun", "error": "ran past", "elapsed_s": 1.0, "budget_s": 1.0})
    on_disk = json.loads((tmp_path / JSON_NAME).read_text())
    assert on_disk["train"] == {"loop": {"step_s": 0.5}} and on_disk["sections"]["train"]["status"] == "overrun"
    assert sorted(p.name for p in tmp_path.iterdir()) == [JSON_NAME]  # no temporary file left
    write_atomic(tmp_path / JSON_NAME, {"a": 1})
    assert Results.load(tmp_path) == {"a": 1} and Results.load(tmp_path / "none") is None


@pytest.mark.slow
def test_resume_keeps_finished_sections_and_runs_the_rest(tmp_path):
    out = ["--dry-run", "--out", str(tmp_path)]
    assert bench_gpu.main([*out, "--sections", "attention", "parity", "--inject-failure", "parity"]) == 0
    first = json.loads((tmp_path / JSON_NAME).read_text())
    assert first["sections"]["attention"]["status"] == "ok" and first["sections"]["parity"]["status"] == "error"
    assert bench_gpu.main([*out, "--resume", "--sections", "attention", "parity"]) == 0
    second = json.loads((tmp_path / JSON_NAME).read_text())
    assert second["attention"] == first["attention"]  # kept, not measured again
    assert second["sections"]["attention"] == first["sections"]["attention"]
    assert second["sections"]["parity"]["status"] == "ok"
    kernels = second["parity"]["kernels"]
    assert {"local", "sdpa", "flex", "sdpa_split"} <= set(kernels) and all(k["ok"] for k in kernels.values())
    # each kernel gets its own gradients: the explicit-softmax kernel rounds differently from
    # sdpa, so its error is small but never exactly 0 (shared leaves would make it 0)
    assert all(0 < kernels["local"][f"{g}_rel_err"] <= 1e-4 for g in ("dq", "dk", "dv"))
    assert "--resume" in second["meta"]["command"]


def test_a_run_where_no_section_produced_figures_fails(tmp_path):
    assert bench_gpu.main(["--dry-run", "--out", str(tmp_path), "--sections", "attention",
                           "--inject-failure", "attention"]) == 1
    results = json.loads((tmp_path / JSON_NAME).read_text())
    assert "injected failure" in results["sections"]["attention"]["error"]
    assert "not measured" in (tmp_path / bench_gpu.MD_NAME).read_text()


def test_compile_counts_see_a_recompile_and_a_graph_break():
    import torch

    def scaled(x, n):
        return x * n

    def broken(x):
        y = x + 1
        torch._dynamo.graph_break()
        return y * 2

    before = gpu_compile_counts.snapshot()
    f = torch.compile(scaled, backend="eager")
    f(torch.ones(2), 1)
    f(torch.ones(2), 2)  # a new Python int: the guard on n fails, dynamo compiles again
    torch.compile(broken, backend="eager")(torch.ones(2))
    counts = gpu_compile_counts.since(before)
    assert counts["recompiles"] >= 1 and counts["graph_breaks"] >= 1 and counts["graphs"] >= 2
