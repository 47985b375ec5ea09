"""The low-data sweep end to end with real cells: `python -m megatron_biglm.cli.lowdata`'s
main() over 2 tasks (synthetic "does the text contain `cat`?" rows in the super_glue RTE and
BoolQ schemas, the tasks' own fixed prompts), N ∈ {0, 8, 32}, 2 seeds and all three paradigms:
every cell a fine-tune (or, at N = 0, a zero-shot score) of a tiny model through the one
fine-tuning entry. The stand-in "instruction-tuned" checkpoint was trained on RTE's prompt,
the base one barely at all, so RTE's instruct curve must sit far above the prompted one
(a mixed-up start point fails that). Checks the CSV, the PNGs, the IPR table against the
trapezoid integrals of the CSV's own curves, and that a rerun runs nothing."""
from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from finetune_entry_fixtures import WORDS, rows as rte_rows, tiny_run, write_splits

PROMPT_WORDS = ["cat", ".", "?", ":", "Question", "Yes", "or", "no", "yes", "Answer"]
NS, SEEDS, TASKS = (0, 8, 32), (0, 1), ("boolq", "rte")


def boolq_rows(n: int, seed: int) -> list[dict]:
    """BoolQ schema: passage = 6 random words, question "cat", label 1 (True -> "yes") iff "cat" is in it."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(6)]
        if i % 2:
            words[rng.randrange(6)] = "cat"
        out.append({"passage": " ".join(words), "question": "cat", "label": i % 2, "idx": i})
    rng.shuffle(out)
    return out


def _base_overrides(tokenizer: str, run_dir: Path) -> dict:
    return {**tiny_run({"tokenizer": tokenizer}, run_dir, lr=3e-3, batch=8, log_interval=50),
            "finetune.max_length": 24, "finetune.eval_batch_size": 64, "finetune.warmup_fraction": 0.1}


def _train(tokenizer: str, files: dict, run_dir: Path, epochs: int, n_train: int) -> str:
    from megatron_biglm.cli.finetune import finetune

    over = {**_base_overrides(tokenizer, run_dir), "finetune.task": "rte", "finetune.epochs": epochs,
            "finetune.train_examples": n_train, "finetune.validate_every_steps": 1000,
            **{f"finetune.data.{s}": p for s, p in files.items()}}
    finetune(None, [f"{k}={v}" for k, v in over.items()])
    return str(run_dir)


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("lowdata_sweep")
    sizes = (64, 64, 0)
    rte = write_splits(tmp / "data" / "rte", rte_rows, sizes, WORDS + PROMPT_WORDS)
    boolq = write_splits(tmp / "data" / "boolq", boolq_rows, sizes, WORDS + PROMPT_WORDS)
    for task in (rte, boolq):
        Path(task["files"].pop("test")).unlink()
    assert rte["tokenizer"] != boolq["tokenizer"]  # same words: either tokenizer serves both
    rte_files = {"train": rte["files"]["train"], "validation": rte["files"]["validation"]}
    base = _train(rte["tokenizer"], rte_files, tmp / "base", epochs=1, n_train=8)        # 1 step
    instruct = _train(rte["tokenizer"], rte_files, tmp / "instruct", epochs=40, n_train=64)  # 320 steps
    config = tmp / "lowdata.yaml"
    config.write_text("finetune: {schedule: linear}\n")
    return {"tmp": tmp, "tokenizer": rte["tokenizer"], "base": base, "instruct": instruct, "config": str(config)}


def _trapezoid_ipr(f: dict, g: dict) -> float:
    """IPR(f, g) = ∫f/∫g − 1 over the Ns both have, the trapezoid rule written out."""
    ns = sorted(set(f) & set(g))
    area = (lambda c: sum((b - a) * (c[a] + c[b]) / 2 for a, b in zip(ns, ns[1:])))
    return area(f) / area(g) - 1


def _sweep(setup, out: Path, capsys) -> str:
    from megatron_biglm.cli.lowdata import main

    cells = {k: v for k, v in _base_overrides(setup["tokenizer"], out).items() if k != "run_dir"}
    assert main(["--config", setup["config"], *[f"{k}={v}" for k, v in cells.items()], "--out", str(out),
                 "--data", str(setup["tmp"] / "data"), "--base-checkpoint", setup["base"],
                 "--instruct-checkpoint", setup["instruct"], "--steps", "4", "--tasks", *TASKS,
                 "--ns", *map(str, NS), "--seeds", *map(str, SEEDS)]) == 0
    return capsys.readouterr().out


@pytest.mark.slow  # ~30 s on an idle core: 2 checkpoints to start from, then 24 fine-tunes and 8 zero-shot scores
def test_sweep_of_real_cells_writes_csv_plots_and_ipr_and_resumes(setup, tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "sweep"
    printed = _sweep(setup, out, capsys)
    assert "ran 32 cells, skipped 0" in printed
    assert "freshly initialised: task_head.dense.weight" in printed  # head cells: base trunk, fresh head
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert list(rows[0]) == ["task", "paradigm", "n", "seed", "score", "metric", "seconds"]
    want = {(t, p, n, s) for t in TASKS for p in ("head", "prompted", "instruct") for n in NS for s in SEEDS
            if n or p != "head"}
    got = {(r["task"], r["paradigm"], int(r["n"]), int(r["seed"])): float(r["score"]) for r in rows}
    assert len(rows) == len(want) == 32 and set(got) == want
    assert all(0 <= v <= 1 for v in got.values()) and {r["metric"] for r in rows} == {"accuracy"}
    for task in TASKS:   # a zero-shot score has no seed to depend on
        for p in ("prompted", "instruct"):
            assert got[task, p, 0, 0] == got[task, p, 0, 1]
    # the score is the cell's own results.json (its only validation, at the last step)
    cell = out / "cells" / "rte" / "prompted" / "n8_seed1"
    results = json.loads((cell / "results.json").read_text())
    assert results["train_steps"] == 4 and [v["step"] for v in results["validations"]] == [4]
    assert results["best_metric"] == got["rte", "prompted", 8, 1]
    assert results["data"]["train_examples"].startswith("8 of 64 usable examples drawn with data.seed=1")
    assert not (cell / "checkpoints").exists()              # deleted once the cell finished
    zero = json.loads((out / "cells" / "rte" / "instruct" / "n0_seed0" / "results.json").read_text())
    assert zero["train_steps"] == 0 and zero["finished"] and zero["best_metric"] == got["rte", "instruct", 0, 0]
    # the instruct start point knows RTE's prompt, the base one does not. Measured with the two
    # start points trained at training.seed 1, 2 (not 5 seeds: a sweep takes minutes on a shared
    # CPU): instruct min 1.00, prompted max 0.50 (chance), IPR 100 %. Bars: chance (0.5) + 1/3
    # of the smallest gain over it; IPR 1/3 of the smallest measured.
    assert min(got["rte", "instruct", n, s] for n in NS for s in SEEDS) >= 0.65
    assert max(got["rte", "prompted", n, s] for n in NS for s in SEEDS) <= 0.75

    for task in TASKS:
        with Image.open(out / f"{task}.png") as image:
            image.verify()
            assert image.format == "PNG" and image.size[0] > 200
    table = {(r["task"], r["pair"]): r for r in csv.DictReader(open(out / "ipr.csv"))}
    assert set(table) == {(t, p) for t in (*TASKS, "average")
                          for p in ("instruct/prompted", "prompted/head", "instruct/head")}
    for task in TASKS:
        curve = lambda p, s: {n: got[task, p, n, s] for n in NS if (task, p, n, s) in got}  # noqa: E731
        for f, g in (("instruct", "prompted"), ("prompted", "head"), ("instruct", "head")):
            per_seed = [_trapezoid_ipr(curve(f, s), curve(g, s)) for s in SEEDS]
            row = table[task, f"{f}/{g}"]
            assert float(row["ipr_mean_pct"]) == pytest.approx(100 * sum(per_seed) / len(per_seed))
            assert row["n_from"] == ("0" if g != "head" else "8") and row["n_to"] == "32"
    assert float(table["rte", "instruct/prompted"]["ipr_mean_pct"]) > 30  # measured 100 (seeds 1, 2): 1/3 of it
    assert "| rte | instruct/prompted |" in (out / "ipr.md").read_text()

    before = (out / "results.csv").read_text()
    assert "ran 0 cells, skipped 32" in _sweep(setup, out, capsys)
    assert (out / "results.csv").read_text() == before
