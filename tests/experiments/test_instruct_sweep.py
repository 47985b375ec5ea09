"""The low-data sweep end to end with fake cell runners (closed-form curves, so the IPR table
is known): the grid (no N = 0 for head fine-tuning), the CSV, a PNG per task, the IPR table,
and resuming (a rerun runs nothing; an interrupted sweep runs only what is left)."""
from __future__ import annotations

import csv

import pytest

from megatron_biglm.experiments.lowdata import Grid, run_sweep
from megatron_biglm.cli.lowdata import main

BASE = {"head": 0.5, "prompted": 0.6, "instruct": 0.66}


def fake(cell):
    """Constant in N, scaled per seed (base × (1 + 0.1 seed)): every seed pair has the same
    IPR, instruct/prompted 10 %, prompted/head 20 %, instruct/head 32 %."""
    return BASE[cell.paradigm] * (1 + 0.1 * cell.seed)


class Counting:
    def __init__(self, fail_after=None):
        self.calls, self.fail_after = [], fail_after

    def __call__(self, cell):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise KeyboardInterrupt("stopped")
        self.calls.append(cell.key)
        return fake(cell)


def test_grid_leaves_out_head_at_zero():
    cells = Grid(("cb",), ns=(0, 8), seeds=(0,)).cells()
    assert [(c.paradigm, c.n) for c in cells] == [("head", 8), ("prompted", 0), ("prompted", 8),
                                                  ("instruct", 0), ("instruct", 8)]
    with pytest.raises(ValueError, match="paradigms"):
        Grid(("cb",), paradigms=("lora",))


@pytest.mark.slow  # ~10 s alone (matplotlib), more on a loaded machine
def test_sweep_writes_csv_plots_and_ipr_and_resumes(tmp_path):
    grid = Grid(("boolq", "cb"), ns=(0, 8, 32), seeds=(0, 1))
    runner = Counting(fail_after=7)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid, {p: runner for p in BASE}, tmp_path)
    assert len(runner.calls) == 7
    resumed = Counting()
    out = run_sweep(grid, {p: resumed for p in BASE}, tmp_path, log=lambda *_: None)
    assert out["ran"] == len(grid.cells()) - 7 == 2 * (2 + 3 + 3) * 2 - 7 and out["skipped"] == 7
    assert not set(resumed.calls) & set(runner.calls)
    rows = list(csv.DictReader(open(out["csv"])))
    assert len(rows) == 32 and {r["metric"] for r in rows if r["task"] == "cb"} == {"macro_f1"}
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in out["plots"])
    assert [p.name for p in out["plots"]] == ["boolq.png", "cb.png"]
    table = {(r["task"], r["pair"]): r for r in out["ipr"]}
    assert table[("cb", "instruct/prompted")]["ipr_mean_pct"] == pytest.approx(10.0)
    assert table[("cb", "instruct/prompted")]["n_from"] == 0
    assert table[("boolq", "prompted/head")]["ipr_mean_pct"] == pytest.approx(20.0)
    assert table[("boolq", "prompted/head")]["n_from"] == 8          # head has no N = 0
    assert table[("average", "instruct/head")]["ipr_mean_pct"] == pytest.approx(32.0)
    assert "| cb | instruct/prompted | 10.0 ± 0.0 | 0–32 |" in out["ipr_md"].read_text()
    again = run_sweep(grid, {p: Counting(fail_after=0) for p in BASE}, tmp_path, log=lambda *_: None)
    assert again["ran"] == 0


@pytest.mark.slow
def test_cli_with_runner_specs(tmp_path, capsys):
    spec = "test_instruct_sweep:fake"
    assert main(["--out", str(tmp_path), "--tasks", "rte", "--ns", "0", "8", "--seeds", "0", "1",
                 "--runner", f"head={spec}", "--runner", f"prompted={spec}", "--runner", f"instruct={spec}"]) == 0
    printed = capsys.readouterr().out
    assert "| rte | instruct/prompted | 10.0 ± 0.0 |" in printed and "head" not in printed.split("IPR")[-1]
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--runner", "lora=x:y"])
    with pytest.raises(ValueError, match="no cell runner"):
        main(["--out", str(tmp_path / "b"), "--tasks", "rte", "--runner", f"head={spec}"])
