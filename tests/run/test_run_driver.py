"""The run driver (`megatron_biglm.run`): a fine-tune's config is loaded once, by its command,
and what the plan learns afterwards (the start checkpoint's shape and tokenizer, the epochs as
steps) is written into the typed sections; no `key=value` text is built and parsed back."""
from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
import yaml

from finetune_entry_fixtures import finetune_overrides, write_task


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return write_task(tmp_path_factory.mktemp("run_task"), n_train=32, n_valid=16, n_test=16)


def test_the_plan_derives_the_schedule_as_typed_sections(task, tmp_path):
    from megatron_biglm.config import load_config
    from megatron_biglm.run import plan_finetune

    cfg = load_config(None, finetune_overrides(task, tmp_path / "run"))
    loaded = cfg.to_yaml()
    plan = plan_finetune(cfg)
    # 32 examples / batch 16 = 2 steps per epoch x 4 epochs; warmup round(0.1 x 8); a checkpoint per epoch
    r = dataclasses.replace
    expected = r(cfg, data=r(cfg.data, seq_length=16),
                 schedule=r(cfg.schedule, style="linear", train_steps=8, warmup_steps=1),
                 training=r(cfg.training, eval_interval=0, eval_iters=0),
                 checkpoint=r(cfg.checkpoint, save_interval=2, save_at_end=True))
    assert plan.config == expected and plan.train_steps == 8 and plan.validator.interval == 2
    assert cfg.to_yaml() == loaded  # the loaded config is not changed under its caller
    with pytest.raises(TypeError, match="loaded RunConfig"):
        plan_finetune(finetune_overrides(task, tmp_path / "run"))


def _audit_opens(seen: list, path: str):
    """An audit hook that records every open of `path` while `seen` is not None-terminated."""
    def hook(event, args):
        if event == "open" and seen and seen[0] == "on" and args and isinstance(args[0], (str, os.PathLike)) \
                and os.path.abspath(os.fspath(args[0])) == path:
            seen.append(event)
    return hook


def test_a_finetune_loads_its_config_once_and_parses_no_override(task, tmp_path, monkeypatch, capsys):
    """Two tiny fine-tunes through `biglm-finetune`'s main: the second starts from the first
    (`finetune.init_from`), with a YAML that names another model shape. The YAML is opened once,
    no `key=value` text is parsed, and the run trains the start's shape and the derived schedule,
    which its config.yaml saves."""
    from megatron_biglm.cli.finetune import main
    from megatron_biglm.config import loading

    def settings(run_dir, **extra) -> dict:
        return {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in finetune_overrides(
            task, run_dir, **{"finetune.epochs": 1, **extra}))}

    def write(path, flat: dict) -> str:
        tree: dict = {}
        for key, value in flat.items():
            *parents, leaf = key.split(".")
            node = tree
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        path.write_text(yaml.safe_dump(tree))
        return str(path.resolve())

    start = tmp_path / "start"
    assert main(["--config", write(tmp_path / "start.yaml", settings(start))]) == 0
    config = write(tmp_path / "ft.yaml", settings(tmp_path / "ft", **{
        "finetune.init_from": str(start), "model.hidden_size": 32, "model.ffn_hidden_size": 96}))
    seen: list = []
    sys.addaudithook(_audit_opens(seen, config))

    def no_override(text):
        raise AssertionError(f"an override string was parsed: {text!r}")

    monkeypatch.setattr(loading, "parse_override", no_override)
    seen.append("on")
    try:
        assert main(["--config", config]) == 0
    finally:
        seen[0] = "off"
    assert len(seen) - 1 == 1, f"the config file was opened {len(seen) - 1} times"
    saved = yaml.safe_load((tmp_path / "ft" / "config.yaml").read_text())
    assert (saved["model"]["hidden_size"], saved["model"]["ffn_hidden_size"]) == (64, 192)  # the start's shape
    assert (saved["schedule"]["train_steps"], saved["checkpoint"]["save_interval"], saved["data"]["seq_length"]) \
        == (2, 2, 16)
    done = json.loads((tmp_path / "ft" / "train_done.json").read_text())
    assert done["iteration"] == 2 and done["initialized_from"].startswith(str(start))
    assert "model from finetune.init_from" in capsys.readouterr().out


def test_a_zero_shot_plan_opens_its_start_checkpoint_once(task, tmp_path):
    """`finetune.train_examples=0` with no `data.tokenizer`: the plan takes the model shape and
    the tokenizer from the start checkpoint and checks that tokenizer against it, all from one
    opening of the start's saved config."""
    from megatron_biglm.config import load_config
    from megatron_biglm.run import finetune, plan_finetune

    start = tmp_path / "start"
    finetune(load_config(None, finetune_overrides(task, start, **{"finetune.epochs": 1})))
    saved_configs = {os.path.abspath(p) for p in start.rglob("config.yaml")}
    over = [o for o in finetune_overrides(task, tmp_path / "zero", **{
        "finetune.init_from": str(start), "finetune.train_examples": 0}) if not o.startswith("data.tokenizer=")]
    cfg = load_config(None, over)
    assert cfg.data.tokenizer is None and saved_configs
    seen: list = []
    for path in saved_configs:
        sys.addaudithook(_audit_opens(seen, path))
    seen.append("on")
    try:
        plan = plan_finetune(cfg)
    finally:
        seen[0] = "off"
    assert plan.train_steps == 0 and plan.config.data.tokenizer  # the start's tokenizer, checked
    assert len(seen) - 1 == 1, f"the start's saved config was opened {len(seen) - 1} times"


def test_a_zero_shot_plan_of_a_kind_that_cannot_score_reads_no_data_file(task, tmp_path):
    """`finetune.train_examples=0` with a head task (its head would be untrained): refused by
    the checks that need no data, before any of the task's files is opened."""
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run import plan_finetune

    cfg = load_config(None, finetune_overrides(task, tmp_path / "zero", **{
        "finetune.task": "rte_head", "finetune.train_examples": 0, "finetune.init_from": str(tmp_path / "start")}))
    data_files = {os.path.abspath(p) for p in task["files"].values()}
    seen: list = []
    for path in data_files:
        sys.addaudithook(_audit_opens(seen, path))
    seen.append("on")
    try:
        with pytest.raises(ConfigError, match="kind verbalizer or contrastive.*its head would be untrained"):
            plan_finetune(cfg)
    finally:
        seen[0] = "off"
    assert len(seen) - 1 == 0, f"the task's data files were opened {len(seen) - 1} times"
