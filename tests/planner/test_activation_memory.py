"""The planner's activations per micro-batch against the bytes the real model's forward saves
for backward (saved_tensors_hooks, each storage once, parameters left out) on one CPU process,
over sequence length, micro-batch, recompute none/selective/full, sdpa/sdpa_split, fp32/bf16.
Each cell must be within 5 %; the worst and mean errors are printed."""
import pytest

from planner_grid import GRID, prediction, predicted_rows
from planner_measure import measure_activations


@pytest.fixture(scope="module")
def grid_errors():
    from megatron_biglm.model.standalone import init_single_process

    init_single_process()
    errors = {}
    for seq, mbs, recompute, backend, precision in GRID:
        rows = predicted_rows(seq)
        measured = measure_activations(seq, mbs, recompute, backend, precision, rows)
        predicted = prediction(seq, mbs, 1, recompute, backend, precision, rows)
        errors[(seq, mbs, recompute, backend, precision)] = (predicted - measured) / measured
    return errors


@pytest.mark.slow
def test_every_cell_within_5_percent(grid_errors):
    worst = max(grid_errors, key=lambda k: abs(grid_errors[k]))
    mean = sum(abs(e) for e in grid_errors.values()) / len(grid_errors)
    print(f"activation grid: {len(grid_errors)} cells, worst {grid_errors[worst]:+.2%} at {worst}, "
          f"mean |error| {mean:.2%}")
    assert all(abs(e) <= 0.05 for e in grid_errors.values()), grid_errors


@pytest.mark.slow
def test_split_kernels_are_exact(grid_errors):
    """sdpa_split keeps no mask: every such cell is exact to 16 bytes."""
    for (seq, mbs, recompute, backend, precision), err in grid_errors.items():
        if backend == "sdpa_split":
            assert abs(err) < 1e-4, (seq, mbs, recompute, precision, err)


@pytest.mark.slow
def test_tp2_cells_within_5_percent():
    """TP 2 on two gloo ranks: every recompute mode, both backends and dtypes at one shape."""
    from planner_grid import GRID
    from torchrun_util import run_function

    cells = [(seq, mbs, 2, rc, be, pr, predicted_rows(seq)) for seq, mbs, rc, be, pr in GRID
             if seq == 128 and mbs == 3]
    res = run_function("tests/fixtures/planner_measure.py:activation_grid_worker", nproc=2, kwargs={"cells": cells},
                       timeout=170).check()
    errors = {}
    for rank, rows in res.results.items():
        for row in rows:
            seq, mbs, tp, recompute, backend, precision, rows_ = row["cell"]
            predicted = prediction(seq, mbs, tp, recompute, backend, precision, rows_)
            errors[(rank, recompute, backend, precision)] = (predicted - row["bytes"]) / row["bytes"]
    worst = max(errors, key=lambda k: abs(errors[k]))
    print(f"activation grid TP 2: {len(errors)} cells, worst {errors[worst]:+.2%} at {worst}")
    assert all(abs(e) <= 0.05 for e in errors.values()), errors
