"""The fine-tuning options the low-data cells stand on, through the entry's planner (no model
is built): `finetune.train_examples=N` keeps exactly N training examples, the same ones for
the same `data.seed`, nested across N (a seed's 8 are among its 32), and says so in the notes
and results.json's `data`; `finetune.min_steps` lifts the schedule; N = 0 plans no training
and refuses what cannot be scored zero-shot; the cell runner's overrides per paradigm."""
from __future__ import annotations

from pathlib import Path

import pytest

from finetune_entry_fixtures import finetune_overrides, write_task
from megatron_biglm.checkpoint.dirs import CheckpointError
from megatron_biglm.config import ConfigError, load_config
from megatron_biglm.experiments.lowdata import Cell
from megatron_biglm.experiments.lowdata.cells import FinetuneCells
from megatron_biglm.run import plan_finetune


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return write_task(tmp_path_factory.mktemp("lowdata_task"))


def _plan(task, tmp_path, **extra):
    return plan_finetune(load_config(None, finetune_overrides(task, tmp_path / "run", **extra)))


def _ids(plan) -> list[tuple]:
    return [tuple(e.input_ids) for e in plan.recipe.train_examples]


def test_train_examples_draws_exactly_n_per_seed_and_reports_it(task, tmp_path):
    everything = set(_ids(_plan(task, tmp_path)))
    draws = {(n, seed): _plan(task, tmp_path, **{"finetune.train_examples": n, "data.seed": seed,
                                                  "finetune.epochs": 1, "finetune.min_steps": 300})
             for n in (8, 32) for seed in (0, 1)}
    for (n, seed), plan in draws.items():
        assert len(plan.recipe.train_examples) == n and set(_ids(plan)) <= everything
        assert len(set(_ids(plan))) == n  # without replacement (the synthetic rows are all distinct)
        line = f"{n} of 192 usable examples drawn with data.seed={seed} (finetune.train_examples)"
        assert plan.recipe.row_summaries()["train_examples"] == line
        assert plan.validator.results()["data"]["train_examples"] == line
        assert any(line in note for note in plan.notes)
        # 8 or 32 examples / batch 16 = 1 or 2 steps per epoch, one epoch, lifted to 300
        assert plan.train_steps == 300 and plan.config.schedule.train_steps == 300
        assert any("lifted to finetune.min_steps=300" in note for note in plan.notes)
        # stretched by min_steps: one validation (and checkpoint) at the end, not one per 1-2 steps
        assert plan.config.checkpoint.save_interval == 300 and plan.validator.interval == 300
    again = _plan(task, tmp_path, **{"finetune.train_examples": 8, "data.seed": 1})
    assert _ids(again) == _ids(draws[8, 1])
    assert _ids(draws[8, 0]) != _ids(draws[8, 1])
    assert set(_ids(draws[8, 0])) <= set(_ids(draws[32, 0]))
    assert set(_ids(draws[8, 1])) <= set(_ids(draws[32, 1]))
    with pytest.raises(ConfigError, match="only 192 usable examples"):
        _plan(task, tmp_path, **{"finetune.train_examples": 193})
    with pytest.raises(ConfigError, match="train_examples must be >= 0"):
        _plan(task, tmp_path, **{"finetune.train_examples": -1})


def test_zero_examples_plan_no_training_and_need_a_prompted_start_point(task, tmp_path):
    without_train_file = {"finetune.train_examples": 0, "finetune.data.train": "/nonexistent.jsonl"}
    with pytest.raises(ConfigError, match="set finetune.init_from"):
        _plan(task, tmp_path, **without_train_file)
    # the start is opened to check the tokenizer the run names against its own (the plan of a
    # real start, scored as it is, runs in test_lowdata_sweep.py)
    with pytest.raises(CheckpointError, match=r"finetune\.init_from: \S+ is not a megatron-biglm checkpoint"):
        _plan(task, tmp_path, **without_train_file, **{"finetune.init_from": str(tmp_path)})
    with pytest.raises(ConfigError, match="kind verbalizer or contrastive.*its head would be untrained"):
        _plan(task, tmp_path, **without_train_file, **{"finetune.init_from": str(tmp_path),
                                                        "finetune.task": "rte_head"})


def test_cell_config_per_paradigm(tmp_path):
    data = tmp_path / "data" / "rte"
    data.mkdir(parents=True)
    (data / "validation.jsonl").write_text("")
    command_line = ["model.preset=tiny", "optimizer.lr=0.5", "optimizer.min_lr=0"]
    cells = FinetuneCells(None, str(tmp_path / "data"), str(tmp_path / "out"),
                          "ckpt/base", "ckpt/instruct", steps=300, overrides=command_line)

    def config(paradigm, n, seed=2):
        return cells.cell_config(Cell("rte", paradigm, n, seed))

    zero = config("instruct", 0)
    assert (zero.finetune.task, zero.finetune.init_from, zero.finetune.train_examples) == ("rte", "ckpt/instruct", 0)
    assert zero.optimizer.lr == 0.5 and zero.model.to_dict()["preset"] == "tiny"  # the command line's, kept
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        config("prompted", 8)
    (data / "train.jsonl").write_text("")
    head, prompted = config("head", 8), config("prompted", 8)
    assert (head.finetune.task, head.finetune.init_from) == ("rte_head", "ckpt/base")
    assert (prompted.finetune.task, prompted.finetune.init_from) == ("rte", "ckpt/base")
    assert prompted.optimizer.lr == 1e-5 and prompted.finetune.min_steps == 300
    assert (prompted.data.seed, prompted.training.seed, prompted.finetune.epochs) == (2, 2, 1)
    assert prompted.finetune.data == {"train": str(data / "train.jsonl"), "validation": str(data / "validation.jsonl")}
    assert Path(prompted.run_dir) == tmp_path / "out" / "cells" / "rte" / "prompted" / "n8_seed2"
    assert Path(prompted.checkpoint.dir) == Path(prompted.run_dir) / "checkpoints"
    with pytest.raises(ValueError, match="no N = 0"):
        config("head", 0)


@pytest.mark.parametrize("args, message", [
    (["--config", "c.yaml"], "needs --data"),
    (["--config", "c.yaml", "--data", "d"], "need --base-checkpoint and --instruct-checkpoint"),
    (["--config", "c.yaml", "--data", "d", "--base-checkpoint", "b", "--paradigms", "head", "instruct"],
     "need --instruct-checkpoint"),
    (["--config", "c.yaml", "--data", "d", "--base-checkpoint", "b", "--paradigms", "head", "--steps", "0"],
     "--steps must be >= 1"),
    (["model.preset=tiny"], "give --config"),
])
def test_cli_says_what_a_fine_tuned_sweep_is_missing(args, message, tmp_path, capsys):
    from megatron_biglm.cli.lowdata import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), *args])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results.csv").exists()
