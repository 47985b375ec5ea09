"""What a run directory holds and what `finetune.overwrite` may delete (run/run_dir.py): only
what the run listed in its manifest; the user's files and a nested run of any kind refuse the
overwrite, naming them, with nothing deleted. A run_dir holding the run's own inputs is refused
before any is read."""
from __future__ import annotations

import json

import pytest

from finetune_entry_fixtures import finetune_overrides, write_task


def _other_run(run_dir):
    """A fine-tune of another learning rate in `run_dir`, as a run leaves it."""
    from megatron_biglm.run.run_dir import write_manifest

    (run_dir / "checkpoints" / "iter_0000002").mkdir(parents=True)
    (run_dir / "checkpoints" / "latest").write_text("iter_0000002\n")
    (run_dir / "metrics.jsonl").write_text("{}\n")
    (run_dir / "results.json").write_text("{}")
    (run_dir / "finetune_run.json").write_text(json.dumps({"task": "other"}))
    write_manifest(run_dir, ["checkpoints", "metrics.jsonl", "results.json", "finetune_run.json", "run_manifest.json"])


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_overwrite_deletes_only_what_the_run_wrote(tmp_path):
    from megatron_biglm.config import load_config
    from megatron_biglm.run.run_claim import check_run_dir

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    run_dir = tmp_path / "run"
    _other_run(run_dir)
    _, note = check_run_dir(load_config(None, finetune_overrides(task, run_dir) + ["finetune.overwrite=true"]))
    assert note == (f"finetune.overwrite: deleted the other run in {run_dir} (what it wrote: checkpoints, "
                    f"finetune_run.json, metrics.jsonl, results.json, run_manifest.json)")
    assert _tree(run_dir) == []


def test_overwrite_refuses_the_users_files_and_a_nested_fine_tune_and_deletes_nothing(tmp_path):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run.run_claim import check_run_dir

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    run_dir = tmp_path / "run"
    _other_run(run_dir)
    (run_dir / "NOTES.txt").write_text("my notes")
    nested = run_dir / "earlier"  # a complete fine-tune kept inside
    (nested / "checkpoints" / "iter_0000004").mkdir(parents=True)
    (nested / "checkpoints" / "best").write_text("iter_0000004\n")
    (nested / "results.json").write_text("{}")
    before = _tree(run_dir)
    cfg = load_config(None, finetune_overrides(task, run_dir) + ["finetune.overwrite=true"])
    with pytest.raises(ConfigError, match=r"holds what no run wrote there: NOTES\.txt, earlier/ \(a fine-tune nested "
                                          r"there\); nothing was deleted"):
        check_run_dir(cfg)
    assert _tree(run_dir) == before


def test_a_run_dir_holding_the_runs_own_data_is_refused_before_it_is_read(tmp_path):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run import finetune

    run_dir = tmp_path / "run"
    task = write_task(run_dir, n_train=8, n_valid=4, n_test=4)  # the data inside the run_dir
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    cfg = load_config(None, finetune_overrides(task, run_dir) + ["finetune.overwrite=true"])
    with pytest.raises(ConfigError, match=rf"run_dir {run_dir} holds this run's own input files "
                                          r"\(finetune\.data\.test=\S+test\.jsonl, finetune\.data\.train=\S+"):
        finetune(cfg)
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_run_dir_and_init_from_the_same_path_says_so(tmp_path):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run import finetune

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    start = tmp_path / "start"
    start.mkdir()
    cfg = load_config(None, finetune_overrides(task, start) + [f"finetune.init_from={start}", "finetune.overwrite=true"])
    with pytest.raises(ConfigError, match=r"run_dir and finetune\.init_from are the same path .*overwrite would not help"):
        finetune(cfg)


def test_a_max_length_past_the_model_names_finetune_max_length(tmp_path):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run.plan import plan_finetune

    task = write_task(tmp_path / "task", n_train=8, n_valid=4, n_test=4)
    cfg = load_config(None, finetune_overrides(task, tmp_path / "run") + ["finetune.max_length=600"])
    limit = cfg.model.resolved.seq_length
    with pytest.raises(ConfigError, match=rf"\Afinetune\.max_length=600 exceeds the model's maximum "
                                          rf"model\.seq_length={limit}; lower finetune\.max_length or set model\.seq_length\Z"):
        plan_finetune(cfg)
