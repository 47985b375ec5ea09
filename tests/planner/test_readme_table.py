"""The README's table of the pretraining presets' plans is the planner's output."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def planned_table() -> str:
    from megatron_biglm.config import load_config
    from megatron_biglm.planner.gpus import get_gpu
    from megatron_biglm.planner.layout import Layout
    from megatron_biglm.planner.plan import plan_layout
    from megatron_biglm.planner.report import presets_markdown
    from megatron_biglm.planner.time_model import DEFAULT_MFU, MFU
    from megatron_biglm.planner.workload import workload_from_config

    rows = []
    for name in ("136m", "360m", "1p3b", "3p5b"):
        nodes = int(re.search(r"#SBATCH --nodes=(\d+)", (REPO / "launch" / f"pretrain_{name}.sh").read_text())[1])
        cfg = load_config(str(REPO / "examples" / "configs" / f"biglm_{name}.yaml"))
        t, par = cfg.training, cfg.parallelism
        tp, pp = par.tensor_model_parallel_size, par.pipeline_model_parallel_size
        layout = Layout(tp, pp, nodes * 8 // (tp * pp), t.micro_batch_size, t.global_batch_size, t.recompute,
                        cfg.optimizer.use_distributed_optimizer)
        tokens = float(cfg.schedule.train_steps * t.global_batch_size * cfg.data.seq_length)
        rows.append((name, plan_layout(workload_from_config(cfg, on_gpu=True), layout, get_gpu("a100-80gb"), 8,
                                       MFU(DEFAULT_MFU, "assumed"), tokens)))
    return presets_markdown(rows)


def test_readme_table_is_the_planners(monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data")
    monkeypatch.setenv("BIGLM_TOKENIZER", "/tok")
    assert planned_table() in (REPO / "README.md").read_text(), planned_table()
