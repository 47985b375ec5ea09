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
