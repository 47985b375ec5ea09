"""README.md, run as a user pastes it: every block its marker says runs, in order, in one
workspace, each command a real subprocess; a non-zero exit or a traceback fails the test with
the README line, the command and its output.

The workspace is what a user has after the quickstart, made small: `python -m
megatron_biglm.cli.quickstart` itself on 8 plays with 40 pretraining steps (tokenizer, indexed
data, a resumed pretraining run, its HF export: the same stages and folders as the full run, in
about 25 s), plus copies of `examples/`, `launch/` and `tools/`. The marker's `inputs:` are written first
(tests/fixtures/readme_inputs.py); its `replace:` lines shrink the run (steps, vocabulary, placeholders
such as `runs/biglm_136m` -> the quickstart's run), its `skip:` lines leave out what needs
SLURM or a download. Blocks marked `not run` say why in the README.

Cost: 41 commands, about 5.7 CPU-minutes in all (measured: 5 min 7 s user + 35 s system; most
of it is each command's import of torch and megatron-core), so about 6 minutes of wall time on
2 idle cores; the same run took 15 min on 2 cores shared with other jobs (load 7-12).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from readme_blocks import README, read_blocks
from readme_inputs import INPUTS

pytestmark = pytest.mark.slow

ROOT = README.parent
QUICKSTART = ["--max-plays", "8", "--steps", "40", "--eval-questions", "12", "--fill-mask-lines", "5",
              "--workers", "1"]


def _env() -> dict:
    """A user's shell: the installed python first on PATH, offline. `PYTHON` is dropped: make
    passes its own (the interpreter a venv was made from) to the tests, and the launch scripts
    would take it for the python that has the package."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHON"}
    env = {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "PATH": os.pathsep.join((os.path.dirname(sys.executable), os.environ.get("PATH", "")))}
    return env


def _run(command: list[str], ws, where: str) -> float:
    start = time.time()
    result = subprocess.run(command, cwd=ws, env=_env(), capture_output=True, text=True, timeout=600)
    log = result.stdout + result.stderr
    assert result.returncode == 0 and "Traceback (most recent call last)" not in log, \
        f"{where} exited {result.returncode}:\n$ {command[-1]}\n{log[-4000:]}"
    return time.time() - start


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    ws = tmp_path_factory.mktemp("readme")
    for folder in ("examples", "launch", "tools"):
        shutil.copytree(ROOT / folder, ws / folder)
    _run([sys.executable, "-m", "megatron_biglm.cli.quickstart", "--out", "runs/quickstart", *QUICKSTART],
         ws, "the quickstart")
    return ws


def test_the_readme_runs_in_order(workspace):
    ran, skipped, seconds = [], [], {}
    for block in read_blocks():
        if not block.runs:
            continue
        for name in block.inputs:
            INPUTS[name](workspace)
        where = f"README line {block.line}"
        if block.language == "python":
            script = workspace / f"readme_line_{block.line}.py"
            script.write_text(block.prepared(), encoding="utf-8")
            commands = [([sys.executable, script.name], None)]
        else:
            if block.write:
                (workspace / block.write).write_text(block.prepared(), encoding="utf-8")
            shell = block.commands() if block.language == "bash" else [(c, None) for c in block.then]
            commands = [(["bash", "-c", command], reason) for command, reason in shell]
        for command, reason in commands:
            if reason:
                skipped.append((where, command[-1], reason))
                continue
            seconds[f"{where}: {command[-1][:70]}"] = _run(command, workspace, where)
            ran.append(where)
    for name, took in seconds.items():
        print(f"{took:6.1f} s  {name}")
    print(f"{len(ran)} commands ran, {len(skipped)} skipped by their markers")
    assert len(ran) >= 35 and len(skipped) <= 6
