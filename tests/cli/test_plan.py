"""`biglm-plan`: the 3.5B preset's plan, its JSON, a layout that does not fit, bad inputs, and a
process that imports no training stack."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_biglm.cli.plan import main

REPO = Path(__file__).resolve().parents[2]
CFG = str(REPO / "examples" / "configs" / "biglm_3p5b.yaml")
ARGS = ["--config", CFG, "--nodes", "32", "--gpus-per-node", "8", "--gpu", "a100-80gb", "--tokens", "3e11"]


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data")
    monkeypatch.setenv("BIGLM_TOKENIZER", "/tok")


def test_3p5b_fits_and_json_carries_the_same_numbers(capsys):
    assert main(ARGS) == 0
    text = capsys.readouterr().out
    assert "fits: yes" in text and "GPU-hours" in text and "(assumed)" in text
    assert main(ARGS + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] and doc["mfu_source"] == "assumed" and doc["tokens"] == 3e11
    mem = doc["stages"][0]["memory_bytes"]
    assert set(mem) == {"weights", "main_weights", "grads", "optimizer", "activations_per_microbatch",
                        "activations", "buffers", "reserve", "total"}
    assert mem["total"] == sum(v for k, v in mem.items() if k not in ("total", "activations_per_microbatch"))
    assert f"{mem['total'] / 1024 ** 3:.2f}" in text
    assert f"{doc['days']:.1f} days" in text
    assert doc["gpu_hours"] == pytest.approx(doc["days"] * 24 * 256)


def test_measured_mfu_is_used_and_said(tmp_path, capsys):
    run = tmp_path / "run.json"
    run.write_text(json.dumps({"mfu": 0.5}))
    assert main(ARGS + ["--json", "--measured", str(run)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mfu"] == 0.5 and doc["mfu_source"] == "measured"


def test_a_layout_that_does_not_fit_is_refused_with_the_nearest_fit(capsys):
    argv = ["--config", CFG, "--nodes", "32", "--gpus-per-node", "8", "--gpu", "a100-40gb",
            "parallelism.tensor_model_parallel_size=1", "parallelism.pipeline_model_parallel_size=1",
            "training.micro_batch_size=64"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "does not fit" in out and "nearest layout that fits: TP=" in out and "does not fit" in err
    assert "activations" in out


@pytest.mark.parametrize("argv,needle", [
    (["--gpu", "a100-41gb"], "'a100-41gb' is not a known GPU kind; choose one of"),
    (["parallelism.tensor_model_parallel_size=8"], "TP=8 must divide the 20 attention heads"),
    (["parallelism.pipeline_model_parallel_size=4"], "PP=4 must divide the 30 layers; valid PP: [1, 2, 3, 5"),
])
def test_bad_input_is_refused_naming_the_value_and_the_choices(argv, needle, capsys):
    assert main(["--config", CFG, "--nodes", "32", "--gpus-per-node", "8"] + argv) == 2
    assert needle in capsys.readouterr().err


def test_whole_micro_batches_are_checked_once_memory_fits(capsys):
    assert main(ARGS + ["training.micro_batch_size=3"]) == 2
    assert "global batch 1024 is not divisible by micro-batch 3 x DP 256" in capsys.readouterr().err


def test_search_ranks_layouts_that_fit(capsys):
    assert main(ARGS + ["--search", "--top", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    speeds = [p["tokens_per_s"] for p in doc["search"]["fits"]]
    assert speeds == sorted(speeds, reverse=True) and all(p["fits"] for p in doc["search"]["fits"])
    assert all("needs" in m["reason"] for m in doc["search"]["near_misses"])


def test_the_presets_use_the_planners_pick():
    """Each pretraining preset's layout is the fastest that fits its launch script's nodes on A100-80GB
    (ties broken towards the larger micro-batch)."""
    import re

    from megatron_biglm.config import load_config
    from megatron_biglm.planner.gpus import get_gpu
    from megatron_biglm.planner.search import search_layouts
    from megatron_biglm.planner.time_model import DEFAULT_MFU, MFU
    from megatron_biglm.planner.workload import workload_from_config

    for name in ("136m", "360m", "1p3b", "3p5b"):
        nodes = int(re.search(r"#SBATCH --nodes=(\d+)", (REPO / "launch" / f"pretrain_{name}.sh").read_text())[1])
        cfg = load_config(str(REPO / "examples" / "configs" / f"biglm_{name}.yaml"))
        w = workload_from_config(cfg, on_gpu=True)
        fits, _ = search_layouts(w, nodes * 8, 8, cfg.training.global_batch_size, get_gpu("a100-80gb"),
                                 MFU(DEFAULT_MFU, "assumed"), 1.0, distopt_choices=(True,))
        best = fits[0].layout
        assert (cfg.parallelism.tensor_model_parallel_size, cfg.parallelism.pipeline_model_parallel_size,
                cfg.training.micro_batch_size, cfg.training.recompute) == (best.tp, best.pp, best.micro_batch,
                                                                           best.recompute), name


def test_tools_script_runs_the_command():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "plan.py"), "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and "biglm-plan" in proc.stdout


def test_a_plan_imports_no_training_stack():
    """Planning reads a config and does arithmetic: megatron-core (and its warnings about missing
    Transformer Engine and Apex) stays out of the process."""
    script = ("import sys; from megatron_biglm.cli.plan import main; code = main(sys.argv[1:]); "
              "print('megatron.core' in sys.modules); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script, *ARGS], capture_output=True, text=True)  # env: _env
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "False" and "fits: yes" in proc.stdout
    assert "Transformer Engine" not in proc.stderr
