"""A fine-tune's checkpoint carries its task-head record (`task_head.json`); the exports and the
inference loader read that record, and a checkpoint saved without one is read through the one
migration (`config/task_head_migration.py`)."""
from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from finetune_entry_fixtures import finetune_overrides, write_task

names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


@settings(max_examples=50, deadline=None)
@given(labels=st.lists(names, min_size=1, max_size=6, unique=True),
       pooling=st.sampled_from(["mean", "first"]),
       problem=st.sampled_from(["single_label_classification", "regression", "multi_label_classification"]),
       query=names, passage=names, normalize=st.booleans(), max_length=st.integers(1, 4096))
def test_records_read_back_as_written(tmp_path_factory, labels, pooling, problem, query, passage, normalize,
                                      max_length):
    from megatron_biglm.checkpoint.task_head import EmbedderRecord, HeadRecord, read_task_head, write_task_head

    folder = tmp_path_factory.mktemp("rec")
    head = HeadRecord("classification", len(labels), pooling, problem, tuple(labels))
    write_task_head(folder, head)
    assert read_task_head(folder) == head
    embedder = EmbedderRecord(pooling, normalize, {"query": query, "passage": passage}, max_length)
    write_task_head(folder, embedder)
    assert read_task_head(folder) == embedder


def test_a_damaged_record_is_refused_naming_the_file(tmp_path):
    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE, read_task_head

    assert read_task_head(tmp_path) is None  # no record: a masked-LM checkpoint, or one for the migration
    (tmp_path / TASK_HEAD_FILE).write_text('{"head": "classification"}')
    with pytest.raises(CheckpointError, match=rf"{TASK_HEAD_FILE} is not a task-head record.*delete it"):
        read_task_head(tmp_path)


def test_the_export_reads_the_record_and_an_old_checkpoint_the_migration(tmp_path):
    """A tiny head fine-tune writes the record into every checkpoint; the HF export's labels
    follow the record (renamed in it, they are renamed in the export), and without the record
    the migration reads the same head off the saved config and weights."""
    from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE, HeadRecord
    from megatron_biglm.cli.finetune import finetune
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.export.head_export import export_head

    task = write_task(tmp_path / "task", n_train=32, n_valid=16, n_test=16)
    results = finetune(None, finetune_overrides(task, tmp_path / "run", **{"finetune.task": "rte_head",
                                                                           "finetune.epochs": 1}))
    ckpt = tmp_path / "run" / "checkpoints" / results["best_checkpoint"]
    saved = json.loads((ckpt / TASK_HEAD_FILE).read_text())
    assert saved == {"head": "classification", "num_labels": 2, "pooling": "mean",
                     "problem_type": "single_label_classification",
                     "id2label": {"0": "entailment", "1": "not_entailment"}}
    head = export_head(open_checkpoint(ckpt))
    assert (head.head, head.options, head.label_names, head.note) == \
        ("classification", {"num_labels": 2, "pooling": "mean"}, ("entailment", "not_entailment"), None)
    saved["id2label"] = {"0": "yes", "1": "no"}
    (ckpt / TASK_HEAD_FILE).write_text(json.dumps(saved))
    assert export_head(open_checkpoint(ckpt)).label_names == ("yes", "no")  # the record, not config.yaml
    (ckpt / TASK_HEAD_FILE).unlink()
    record, note = open_checkpoint(ckpt).task_head()
    assert record == HeadRecord("classification", 2, "mean", "single_label_classification",
                                ("entailment", "not_entailment")) and note is None
    # a checkpoint saved when the label names were a finetune: key reads through the config's migration
    saved_config = yaml.safe_load((ckpt / "config.yaml").read_text())
    names = saved_config["finetune"]["options"].pop("label_names")
    saved_config["finetune"].update(label_names=["follows", "not"], problem_type="single_label_classification")
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved_config))
    manifest = json.loads((ckpt / "COMPLETE.json").read_text())  # as that run sealed it
    manifest["files"]["config.yaml"] = (ckpt / "config.yaml").stat().st_size
    (ckpt / "COMPLETE.json").write_text(json.dumps(manifest))
    assert names == ["entailment", "not_entailment"]
    assert open_checkpoint(ckpt).task_head()[0].id2label == ("follows", "not")
