"""The planner's static memory equals the bytes megatron allocates, exactly, on every rank:
weights, fp32 main weights, the gradient buffer with its padding and Adam's states, after one
optimizer step, over TP/PP/DP 1 and 2, the distributed optimizer on and off, fp32 and bf16."""
import itertools

import pytest

from planner_measure import measure_static, run_config
from torchrun_util import run_function

from megatron_biglm.planner.layout import Layout
from megatron_biglm.planner.static_memory import static_memory
from megatron_biglm.planner.workload import workload_from_config

CASES = [(d, p) for d, p in itertools.product((True, False), ("fp32", "bf16"))]


def predicted(tp, pp, dp, distopt, precision, stage, dp_rank):
    w = workload_from_config(run_config(**{"training.precision": precision}), on_gpu=False)
    layout = Layout(tp=tp, pp=pp, dp=dp, micro_batch=1, global_batch=dp, distributed_optimizer=distopt)
    s = static_memory(w, layout, stage, dp_rank)
    return dict(weights=s.weights, main_weights=s.main_weights, grads=s.grads, optimizer=s.optimizer)


@pytest.mark.slow
@pytest.mark.parametrize("distopt,precision", CASES)
def test_static_memory_one_process(distopt, precision):
    from megatron_biglm.model.standalone import init_single_process

    init_single_process()
    got = measure_static(1, 1, distopt, precision)
    assert predicted(1, 1, 1, distopt, precision, 0, 0) == {k: got[k] for k in
                                                           ("weights", "main_weights", "grads", "optimizer")}


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (1, 1)])
def test_static_memory_two_ranks(tp, pp):
    """Two gloo ranks: TP 2, PP 2 or DP 2; every case on both ranks."""
    cases = [(tp, pp, d, p) for d, p in CASES]
    res = run_function("tests/fixtures/planner_measure.py:static_grid_worker", nproc=2, kwargs={"cases": cases},
                       timeout=170).check()
    dp = 2 // (tp * pp)
    for rank, rows in res.results.items():
        for row in rows:
            _, _, distopt, precision = row["case"]
            want = predicted(tp, pp, dp, distopt, precision, row["stage"], row["dp_rank"])
            assert want == {k: row[k] for k in want}, (rank, row)
