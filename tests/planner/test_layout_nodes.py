"""A TP group wider than a node: it can run (its all-reduces cross the network), so a given
layout is planned and costed, while the search proposes TP inside a node only."""
import pytest

from megatron_biglm.config import load_config
from megatron_biglm.planner.errors import PlanError
from megatron_biglm.planner.gpus import get_gpu
from megatron_biglm.planner.layout import Layout, check_layout, valid_tp
from megatron_biglm.planner.time_model import MFU, step_time
from megatron_biglm.planner.workload import workload_from_config


def test_tp_across_nodes_is_a_layout_that_runs_and_costs_the_network(monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data")
    monkeypatch.setenv("BIGLM_TOKENIZER", "/tok")
    layout = Layout(tp=2, pp=1, dp=1, micro_batch=1, global_batch=4)
    check_layout(layout, num_layers=4, num_heads=4, num_groups=2, gpus_per_node=1, world=2)
    assert valid_tp(4, 2, 1) == [1]
    with pytest.raises(PlanError, match=r"TP=3 must divide the 4 attention heads and 2 query groups"):
        check_layout(layout.with_(tp=3), num_layers=4, num_heads=4, num_groups=2, gpus_per_node=4, world=6)

    w = workload_from_config(load_config("examples/configs/biglm_136m.yaml"), on_gpu=True)
    gpu = get_gpu("a100-80gb")
    tp2 = Layout(tp=2, pp=1, dp=1, micro_batch=4, global_batch=8)
    inside = step_time(w, tp2, gpu, 8, MFU(0.4, "assumed"))
    across = step_time(w, tp2, gpu, 1, MFU(0.4, "assumed"))
    assert across.tp_comm_s / inside.tp_comm_s == pytest.approx(gpu.nvlink_gbps / gpu.network_gbps)
