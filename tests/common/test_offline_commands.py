"""Without the hub, a command that would read from it stops with one line naming the local
input to pass instead (the rule of common/hub.py), never with a traceback: the zero-shot suite
without `--data-dir`, lm-eval's own CLI, and a fine-tune whose split comes from the hub.

Each runs as a real subprocess with the hub switched off and an empty HF cache (so nothing
cached on this machine can answer in its place); those three are slow (a model load or the
full import each, ~15-60 s).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from eval_fixtures import biglm_dir, bpe_dir  # noqa: F401

from megatron_biglm.common.hub import HubUnavailable, hub_access, is_hub_unreachable

REPO = Path(__file__).resolve().parents[2]


def _offline(command: list[str], tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    return subprocess.run([sys.executable, "-m", *command], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)


def _one_line_naming(proc, words: list[str]) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    assert len(errors) == 1 and all(w in errors[0] for w in words), proc.stderr[-3000:]
    return errors[0]


@pytest.mark.slow
def test_zero_shot_suite_without_data_dir_names_it(tmp_path, biglm_dir):
    proc = _offline(["megatron_biglm.cli.eval_zero_shot", "--model", "biglm", "--model-args",
                     f"path={biglm_dir},progress=false", "--suite", "arc_easy"], tmp_path)
    line = _one_line_naming(proc, ["could not reach the Hugging Face hub", "--data-dir DIR", "--skip-missing"])
    assert proc.returncode == 1 and "arc_easy" in line


@pytest.mark.slow
def test_lm_eval_cli_names_the_local_way(tmp_path, biglm_dir):
    proc = _offline(["megatron_biglm.cli.lm_eval", "run", "--model", "biglm", "--model_args",
                     f"path={biglm_dir},progress=false", "--tasks", "arc_easy", "--limit", "2"], tmp_path)
    _one_line_naming(proc, ["could not reach the Hugging Face hub", "eval_zero_shot --data-dir DIR"])


@pytest.mark.slow
def test_fine_tune_split_from_the_hub_names_the_file_key(tmp_path, bpe_dir):
    config = tmp_path / "cb_hub.yaml"
    config.write_text(f"run_dir: {tmp_path / 'run'}\nmodel: {{preset: tiny}}\ndata: {{tokenizer: {bpe_dir}}}\n"
                      "finetune: {task: cb, hub: true}\n")
    proc = _offline(["megatron_biglm.cli.finetune", "--config", str(config)], tmp_path)
    _one_line_naming(proc, ["super_glue", "finetune.data.train=FILE"])


def test_only_an_unreachable_hub_is_turned_into_the_advice():
    """Other failures pass through unchanged; the cause chain is followed (datasets wraps
    huggingface_hub's error in a ConnectionError `from` it)."""
    class LocalEntryNotFoundError(Exception):
        pass

    try:
        try:
            raise LocalEntryNotFoundError("no cache")
        except LocalEntryNotFoundError as inner:
            raise RuntimeError("loading failed") from inner
    except RuntimeError as exc:
        assert is_hub_unreachable(exc)
    assert not is_hub_unreachable(KeyError("label"))
    with pytest.raises(HubUnavailable, match="offline, pass --data-dir DIR$"):
        with hub_access("the data", "--data-dir DIR"):
            raise ConnectionError("Couldn't reach 'allenai/ai2_arc' on the Hub")
    with pytest.raises(KeyError):
        with hub_access("the data", "--data-dir DIR"):
            raise KeyError("label")
