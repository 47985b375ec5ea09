"""`python -m megatron_biglm.cli.eval_zero_shot --suite paper` on a tiny BiGLM export and local task data."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from eval_fixtures import biglm_dir, bpe_dir, one_torch_thread, write_task_data  # noqa: F401

from megatron_biglm.cli import eval_zero_shot as cli
from megatron_biglm.evaluation.tasks import PAPER_SUITE, resolve_tasks

REPO = Path(__file__).resolve().parents[2]


def _parse_table(text: str) -> tuple[list[str], list[str], list[str]]:
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")]
    header, _, metrics, values = rows[:4]
    return header, metrics, values


def test_paper_suite_table_and_json(tmp_path, biglm_dir, capsys):
    data = write_task_data(tmp_path / "data", [t.name for t in PAPER_SUITE], n=2)
    out = tmp_path / "results.json"
    code = cli.main(["--model", "biglm", "--model-args", f"path={biglm_dir},progress=false",
                     "--suite", "paper", "--data-dir", str(data), "--output", str(out),
                     "--label", "tiny-biglm"])
    assert code == 0
    header, metrics, values = _parse_table(capsys.readouterr().out)
    assert header == ["Model", "ARC-E", "ARC-C", "PIQA", "SciQ", "Wino.", "LogiQA", "RACE",
                      "SIQA", "BoolQ", "Hella.", "Truth.", "AVG."]
    assert metrics[1:-1] == ["acc", "acc_norm", "acc_norm", "acc", "acc", "acc_norm", "acc",
                             "acc", "acc", "acc_norm", "acc"]
    assert values[0] == "tiny-biglm"

    results = json.loads(out.read_text())  # lm-eval's layout, plus our suite block
    assert {"results", "configs", "versions", "n-shot", "config"} <= set(results)
    assert results["config"]["masked_lm_eval"]["scoring"] == "beam"
    assert results["config"]["masked_lm_eval"]["split_mode"] == "4d-mask"
    table_values = [float(v) for v in values[1:-1]]
    for task, shown in zip(PAPER_SUITE, table_values):
        raw = results["results"][task.name][f"{task.metric},none"]
        assert shown == pytest.approx(100 * raw, abs=0.006)
        assert results["zero_shot_suite"]["tasks"][task.name]["score"] == pytest.approx(100 * raw)
    assert float(values[-1]) == pytest.approx(sum(table_values) / 11, abs=0.01)


def test_task_list_missing_data_and_skip(tmp_path, biglm_dir, capsys):
    data = write_task_data(tmp_path / "data", ["boolq"], n=2)
    args = ["--model", "biglm", "--model-args", f"path={biglm_dir},progress=false",
            "--suite", "boolq,sciq", "--data-dir", str(data)]
    assert cli.main(args) == 1
    assert "no local data for 1 task(s):\n  sciq" in capsys.readouterr().err
    assert cli.main(args + ["--skip-missing"]) == 0
    text = capsys.readouterr().out
    header, _, values = _parse_table(text)
    assert header == ["Model", "BoolQ", "SciQ", "AVG."] and values[2] == "-"
    assert "AVG. over 1 of 2 tasks" in text and "skipped 1 task(s) without local data: sciq" in text


def test_resolve_tasks_keeps_paper_metrics_for_known_names():
    tasks = resolve_tasks("hellaswag, mmlu_anatomy")
    assert [(t.name, t.label, t.metric) for t in tasks] == [
        ("hellaswag", "Hella.", "acc_norm"), ("mmlu_anatomy", "mmlu_anatomy", "acc")]


@pytest.mark.slow  # a fresh interpreter importing lm-eval, transformers and torch: 15-40 s
def test_lm_eval_own_cli_runs_our_models(tmp_path, biglm_dir):
    """`python -m megatron_biglm.cli.eval_zero_shot run ...` is lm-eval's CLI with biglm/hf-mlm
    registered; its default device cuda:0 falls back to CPU on machines without CUDA. What it
    scores equals what `lm_eval.simple_evaluate` scores in this process: every document's
    log-likelihoods and the accuracy."""
    from megatron_biglm.evaluation.tasks import write_local_task_yamls

    data = write_task_data(tmp_path / "data", ["boolq"], n=2)
    write_local_task_yamls(["boolq"], data, tmp_path / "yaml")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_biglm.cli.lm_eval", "run", "--model", "biglm",
         "--model_args", f"path={biglm_dir},scoring=oneshot", "--tasks", "boolq",
         "--include_path", str(tmp_path / "yaml"), "--output_path", str(out), "--log_samples"],
        capture_output=True, text=True, timeout=600, cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"})  # tiny model: threads only contend
    assert proc.returncode == 0, proc.stderr[-2000:]
    (result_file,) = out.rglob("results_*.json")
    results = json.loads(result_file.read_text())
    assert results["config"]["masked_lm_eval"]["scoring"] == "oneshot"
    (samples_file,) = out.rglob("samples_boolq_*.jsonl")
    cli = {s["doc_id"]: s for s in map(json.loads, samples_file.read_text().splitlines())}

    import lm_eval

    from megatron_biglm.evaluation import register_lm_eval_models
    from megatron_biglm.evaluation.tasks import local_task_manager

    register_lm_eval_models()
    here = lm_eval.simple_evaluate(model="biglm", model_args=f"path={biglm_dir},scoring=oneshot", tasks=["boolq"],
                                   task_manager=local_task_manager(str(tmp_path / "yaml")), log_samples=True)
    mine = {s["doc_id"]: s for s in here["samples"]["boolq"]}
    assert sorted(cli) == sorted(mine) == [0, 1]
    for doc in cli:
        got = [float(r[0][0]) for r in cli[doc]["resps"]]
        want = [float(r[0][0]) for r in mine[doc]["resps"]]
        assert got == pytest.approx(want, abs=1e-5) and len(got) == 2  # yes / no
    assert results["results"]["boolq"]["acc,none"] == here["results"]["boolq"]["acc,none"]
