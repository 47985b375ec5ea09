"""Which fine-tune a run directory holds (run/run_claim.py): a record written before a kind's
settings moved into its options is read through the config's one migration, so the same run
resumes, and a record that differs is refused naming what differs."""
from __future__ import annotations

import json

import pytest

from finetune_entry_fixtures import finetune_overrides, write_task


def test_a_run_recorded_with_the_old_keys_is_resumed_not_refused(tmp_path):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run.run_claim import RUN_FILE, check_run_dir, run_identity

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    cfg = load_config(None, finetune_overrides(task, tmp_path / "run"))
    mine = json.loads(json.dumps(run_identity(cfg), default=str))
    options = mine.pop("options")
    before = {**mine, "options": {}, "template": options["template"], "label_words": options["label_words"]}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RUN_FILE).write_text(json.dumps(before))
    claim, note = check_run_dir(cfg)
    assert note is None and claim.identity["options"] == options
    before["label_words"] = ["no", "yes"]
    (run_dir / RUN_FILE).write_text(json.dumps(before))
    with pytest.raises(ConfigError, match="holds another run .*options"):
        check_run_dir(cfg)


@pytest.mark.parametrize("override,key", [
    ("finetune.schedule=wsd", "finetune.schedule"), ("finetune.warmup_fraction=0.2", "finetune.warmup_fraction"),
    ("optimizer.weight_decay=0.1", "optimizer.weight_decay"), ("optimizer.clip_grad=0.5", "optimizer.clip_grad"),
    ("optimizer.adam_beta2=0.999", "optimizer.adam_beta2"), ("optimizer.min_lr=1e-5", "optimizer.min_lr")])
def test_a_resume_that_changes_the_trajectory_is_refused_naming_the_setting(tmp_path, override, key):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run.run_claim import check_run_dir

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    first = load_config(None, finetune_overrides(task, tmp_path / "run"))
    claim, _ = check_run_dir(first)
    claim.on_start()
    again = load_config(None, finetune_overrides(task, tmp_path / "run") + [override])
    with pytest.raises(ConfigError, match=rf"holds another run .*{key}: .* there, .* here.*"
                                          rf"finetune.resume_changes=\[{key}\]"):
        check_run_dir(again)
    # the escape hatch: named on purpose, the resume goes on and says so
    hatch = load_config(None, finetune_overrides(task, tmp_path / "run") + [override, f"finetune.resume_changes=[{key}]"])
    _, note = check_run_dir(hatch)
    assert note.startswith(f"finetune.resume_changes: resuming with {key}=")
    with pytest.raises(ConfigError, match="finetune.resume_changes names .*'optimizer.lrr'.*did you mean 'optimizer.lr'"):
        check_run_dir(load_config(None, finetune_overrides(task, tmp_path / "run") + ["finetune.resume_changes=[optimizer.lrr]"]))


def test_a_record_without_the_trajectory_settings_resumes(tmp_path):
    from megatron_biglm.config import load_config
    from megatron_biglm.run.run_claim import RUN_FILE, check_run_dir, run_identity

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    cfg = load_config(None, finetune_overrides(task, tmp_path / "run"))
    mine = json.loads(json.dumps(run_identity(cfg), default=str))
    trajectory = mine.pop("trajectory")
    before = {**mine, "lr": trajectory["optimizer.lr"], "global_batch_size": trajectory["training.global_batch_size"]}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_FILE).write_text(json.dumps(before))
    assert check_run_dir(cfg)[1] is None
