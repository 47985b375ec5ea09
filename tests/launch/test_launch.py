"""SLURM launch scripts in DRY_RUN mode: the printed torchrun command is consistent."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from megatron_biglm.config import check_batch_arithmetic, load_config

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ["pretrain_136m.sh", "pretrain_360m.sh", "pretrain_1p3b.sh", "pretrain_3p5b.sh"]


@pytest.fixture(autouse=True)
def _paths(monkeypatch):
    monkeypatch.setenv("DATA_ROOT", "/data")
    monkeypatch.setenv("BIGLM_TOKENIZER", "/tok")


def _dry_run(script, **env):
    import sys

    full = {**os.environ, "DRY_RUN": "1", "DATA_ROOT": "/data", "BIGLM_TOKENIZER": "/tok",
            "PYTHON": sys.executable, "PYTHONPATH": str(REPO), **env}
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "NODES", "TP", "PP", "MBS", "GBS"):
        if key not in env:
            full.pop(key, None)
    return subprocess.run(["bash", str(REPO / "launch" / script)], capture_output=True, text=True,
                          env=full, cwd=REPO)


def _command(stdout):
    argv = shlex.split(stdout.strip().splitlines()[-1])
    opts = dict(re.match(r"--([\w-]+)=(.*)", a).groups() for a in argv if re.match(r"--[\w-]+=", a))
    overrides = argv[argv.index("--config") + 2:]
    return argv, opts, argv[argv.index("--config") + 1], overrides


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_layout_matches_nodes(script):
    text = (REPO / "launch" / script).read_text()
    sbatch_nodes = int(re.search(r"#SBATCH --nodes=(\d+)", text).group(1))
    assert "#SBATCH --signal=USR1@120" in text and "#SBATCH --requeue" in text
    proc = _dry_run(script)
    assert proc.returncode == 0, proc.stderr
    argv, opts, config_path, overrides = _command(proc.stdout)
    assert argv[0] == "srun" and "torch.distributed.run" in argv and "megatron_biglm.cli.train" in argv
    nnodes, nproc = int(opts["nnodes"]), int(opts["nproc-per-node"])
    assert nnodes == sbatch_nodes and nproc == 8 and opts["rdzv-backend"] == "c10d"
    cfg = load_config(config_path, overrides)
    tp, pp = cfg.parallelism.tensor_model_parallel_size, cfg.parallelism.pipeline_model_parallel_size
    world = nnodes * nproc
    assert world % (tp * pp) == 0
    dp = world // (tp * pp)
    assert tp * pp * dp == world
    assert f"dp={dp}" in proc.stdout and f"tp={tp} pp={pp}" in proc.stdout
    assert check_batch_arithmetic(cfg, dp) >= 1 and cfg.training.global_batch_size == 1024
    # the model's preset must accept this layout (heads, groups, layers divisible)
    from megatron_biglm.model.presets import load_preset
    load_preset(cfg.model["preset"]).check_parallel_layout(tp, pp)
    assert "export NCCL_DEBUG=" in proc.stdout and "export CUDA_DEVICE_MAX_CONNECTIONS=1" in proc.stdout


def test_env_overrides_nodes_layout_and_extra_args():
    proc = _dry_run("pretrain_3p5b.sh", NODES="4", TP="4", PP="1", EXTRA_ARGS="optimizer.lr=1e-4")
    assert proc.returncode == 0, proc.stderr
    _, opts, config_path, overrides = _command(proc.stdout)
    assert opts["nnodes"] == "4"
    cfg = load_config(config_path, overrides)
    assert cfg.parallelism.tensor_model_parallel_size == 4 and cfg.optimizer.lr == pytest.approx(1e-4)
    assert "dp=8" in proc.stdout


def test_bad_layout_and_batch_fail_before_launch():
    proc = _dry_run("pretrain_136m.sh", NODES="1", TP="3", PP="1")
    assert proc.returncode == 2 and "not divisible by TP*PP" in proc.stderr
    proc = _dry_run("pretrain_136m.sh", GBS="1000")
    assert proc.returncode == 2 and "global batch 1000 is not divisible" in proc.stderr
    proc = _dry_run("pretrain_136m.sh", CONFIG="/nonexistent.yaml")
    assert proc.returncode == 2 and "not found" in proc.stderr


def test_local_dry_run():
    env = {**os.environ, "DRY_RUN": "1", "NPROC": "2"}
    proc = subprocess.run(["bash", str(REPO / "launch" / "local.sh"), "parallelism.tensor_model_parallel_size=2"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    argv = shlex.split(proc.stdout.strip().splitlines()[-1])
    assert "--standalone" in argv and "--nproc-per-node=2" in argv
    assert argv[-1] == "parallelism.tensor_model_parallel_size=2"
    assert argv[argv.index("--config") + 1].endswith("examples/configs/tiny_cpu.yaml")


def test_launch_prints_kernels_and_refuses_a_missing_kernel_before_srun(tmp_path):
    import sys

    from megatron_biglm.model.attention_params import flash_attn_available

    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\necho fake srun called\n")
    (fake / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "NODES": "1", "GPUS_PER_NODE": "1", "TP": "1", "PP": "1", "GBS": "8", "REQUEUE": "0",
           "CONFIG": str(REPO / "examples" / "configs" / "tiny_cpu.yaml"), "RUN_DIR": str(tmp_path / "run")}
    for key in ("DRY_RUN", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_JOB_ID"):
        env.pop(key, None)
    script = str(REPO / "launch" / "pretrain_136m.sh")
    proc = subprocess.run(["bash", script, "model.attention_backend=sdpa"], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "kernels: attention sdpa (model.attention_backend=sdpa)" in proc.stdout
    assert "versions: python" in proc.stdout and "fake srun called" in proc.stdout
    if not flash_attn_available():
        proc = subprocess.run(["bash", script, "model.attention_backend=flash"], capture_output=True, text=True,
                              env=env, cwd=REPO)
        assert proc.returncode == 2 and "pip install flash-attn" in proc.stderr
        assert "fake srun called" not in proc.stdout


@pytest.mark.skipif(not Path("/usr/bin/python3").is_file(), reason="needs a system python without the package")
def test_preprocess_with_a_python_that_lacks_the_package_names_the_PYTHON_variable(tmp_path):
    """The shard launcher runs `$PYTHON -m ...`; a `python` on PATH without the package (or its
    dependencies) is refused up front with the variable to set, not with a traceback."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PYTHON="/usr/bin/python3", DRY_RUN="1", SHARDS="2", INPUT=str(tmp_path / "c.jsonl"))
    done = subprocess.run(["bash", str(REPO / "launch" / "preprocess.sh")], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("preprocess: PYTHON=/usr/bin/python3 cannot import megatron_biglm (")
    assert "set PYTHON to the python that has the package installed" in done.stderr
    assert "Traceback" not in done.stderr


def test_finetune_dry_run_shows_the_tasks_batch_sizes_unless_set():
    proc = _dry_run("finetune.sh", TASK="boolq")
    assert proc.returncode == 0, proc.stderr
    assert "mbs=8 gbs=16" in proc.stdout and "mbs from config, gbs from config" in proc.stdout
    _, _, _, overrides = _command(proc.stdout)
    assert not any(o.startswith(("training.micro_batch_size", "training.global_batch_size")) for o in overrides)
    proc = _dry_run("finetune.sh", TASK="boolq", MBS="4")
    assert proc.returncode == 0, proc.stderr
    assert "mbs=4 gbs=16" in proc.stdout and "mbs from environment MBS, gbs from config" in proc.stdout


def test_a_python_without_the_package_is_one_line():
    proc = _dry_run("pretrain_136m.sh", PYTHON="/bin/false")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "cannot import megatron_biglm" in proc.stderr and "Traceback" not in proc.stderr


def _fake_srun_env(tmp_path, **extra):
    import sys

    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text("#!/bin/sh\necho fake srun called\n")
    (fake / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "PYTHONPATH": str(REPO), "REQUEUE": "0", "DATA_ROOT": "/data", "BIGLM_TOKENIZER": "/tok",
           "RUN_DIR": str(tmp_path / "run"), **extra}
    for key in ("DRY_RUN", "SLURM_JOB_NUM_NODES", "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "TP", "PP", "MBS", "GBS"):
        if key not in extra:
            env.pop(key, None)
    return env


@pytest.mark.slow
def test_a_layout_that_does_not_fit_is_refused_before_srun(tmp_path):
    """PLAN=refuse (the default) stops before srun with the planner's line; PLAN=warn runs it."""
    env = _fake_srun_env(tmp_path, NODES="1", GPU_KIND="a100-40gb", MBS="64", GBS="512")
    script = str(REPO / "launch" / "pretrain_3p5b.sh")
    args = ["model.attention_backend=sdpa", "training.precision=fp32"]  # the kernel check passes on a CPU
    proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "biglm-plan: does not fit" in proc.stderr and "nearest that fits" in proc.stderr
    assert "fake srun called" not in proc.stdout
    proc = subprocess.run(["bash", script, *args], capture_output=True, text=True, env={**env, "PLAN": "warn"},
                          cwd=REPO)
    assert proc.returncode == 0 and "fake srun called" in proc.stdout and "PLAN=warn" in proc.stderr
