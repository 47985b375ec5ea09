"""A fine-tune's checkpoint carries its task-head record (`task_head.json`); the exports and the
inference loader read that record, and a checkpoint saved without one is read through the one
migration (`config/task_head_migration.py`)."""
from __future__ import annotations

import json
from pathlib import Path

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
    from megatron_biglm.checkpoint.task_head import (TASK_HEAD_FILE, EmbedderRecord, HeadRecord, read_task_head,
                                                     task_head_text)

    folder = tmp_path_factory.mktemp("rec")
    head = HeadRecord("classification", len(labels), pooling, problem, tuple(labels))
    (folder / TASK_HEAD_FILE).write_text(task_head_text(head), encoding="utf-8")
    assert read_task_head(folder) == head
    embedder = EmbedderRecord(pooling, normalize, {"query": query, "passage": passage}, max_length)
    (folder / TASK_HEAD_FILE).write_text(task_head_text(embedder), encoding="utf-8")
    assert read_task_head(folder) == embedder


def test_a_damaged_record_is_refused_naming_the_file(tmp_path):
    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE, read_task_head

    assert read_task_head(tmp_path) is None  # no record: a masked-LM checkpoint, or one for the migration
    (tmp_path / TASK_HEAD_FILE).write_text('{"head": "classification"}')
    with pytest.raises(CheckpointError, match=rf"{TASK_HEAD_FILE} is not a task-head record.*delete it"):
        read_task_head(tmp_path)


@pytest.fixture(scope="module")
def head_checkpoint(tmp_path_factory):
    """The best checkpoint of a tiny head fine-tune (tests copy it before changing it)."""
    from megatron_biglm.cli.finetune import finetune

    tmp_path = tmp_path_factory.mktemp("head_run")
    task = write_task(tmp_path / "task", n_train=32, n_valid=16, n_test=16)
    results = finetune(None, finetune_overrides(task, tmp_path / "run", **{"finetune.task": "rte_head",
                                                                           "finetune.epochs": 1}))
    return tmp_path / "run" / "checkpoints" / results["best_checkpoint"]


def _copy(checkpoint, tmp_path):
    import shutil

    return Path(shutil.copytree(checkpoint, tmp_path / "checkpoints" / checkpoint.name))


def _reseal(ckpt, name):
    """Rewrite the manifest's entry for `name` as a run that sealed the file so would have
    (removed when the file is gone: a checkpoint saved before the file existed)."""
    manifest = json.loads((ckpt / "COMPLETE.json").read_text())
    if (ckpt / name).is_file():
        manifest["files"][name] = (ckpt / name).stat().st_size
    else:
        del manifest["files"][name]
    (ckpt / "COMPLETE.json").write_text(json.dumps(manifest))


def test_the_record_is_sealed_with_the_checkpoint_and_verified(head_checkpoint, tmp_path):
    """task_head.json is in every checkpoint's manifest: the verifier every load runs refuses a
    checkpoint whose record was edited or lost after the save, naming the file."""
    from megatron_biglm.checkpoint.dirs import CheckpointError, complete_checkpoints
    from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE
    from megatron_biglm.checkpoint.verify import verify_checkpoint
    from megatron_biglm.config.trained_checkpoint import open_checkpoint

    for ckpt in complete_checkpoints(head_checkpoint.parent):
        files = json.loads((ckpt / "COMPLETE.json").read_text())["files"]
        assert files[TASK_HEAD_FILE] == (ckpt / TASK_HEAD_FILE).stat().st_size
    ckpt = _copy(head_checkpoint, tmp_path)
    assert verify_checkpoint(ckpt).items > 0
    saved = json.loads((ckpt / TASK_HEAD_FILE).read_text())
    saved["id2label"]["1"] = "contradiction"
    (ckpt / TASK_HEAD_FILE).write_text(json.dumps(saved, indent=1) + "\n")
    for load in (verify_checkpoint, open_checkpoint):
        with pytest.raises(CheckpointError, match=rf"file {TASK_HEAD_FILE} has \d+ bytes, the manifest says \d+"):
            load(ckpt)
    (ckpt / TASK_HEAD_FILE).unlink()
    with pytest.raises(CheckpointError, match=rf"file {TASK_HEAD_FILE} is missing"):
        verify_checkpoint(ckpt)


def test_the_export_reads_the_record_and_an_old_checkpoint_the_migration(head_checkpoint, tmp_path):
    """A tiny head fine-tune seals the record into every checkpoint; the HF export's labels
    follow the record (renamed in it, they are renamed in the export), and without the record
    the migration reads the same head off the saved config and weights."""
    from megatron_biglm.checkpoint.task_head import TASK_HEAD_FILE, HeadRecord
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.export.head_export import export_head

    ckpt = _copy(head_checkpoint, tmp_path)
    saved = json.loads((ckpt / TASK_HEAD_FILE).read_text())
    assert saved == {"head": "classification", "num_labels": 2, "pooling": "mean",
                     "problem_type": "single_label_classification",
                     "id2label": {"0": "entailment", "1": "not_entailment"}}
    head = export_head(open_checkpoint(ckpt))
    assert (head.head, head.options, head.label_names, head.note) == \
        ("classification", {"num_labels": 2, "pooling": "mean"}, ("entailment", "not_entailment"), None)
    saved["id2label"] = {"0": "yes", "1": "no"}
    (ckpt / TASK_HEAD_FILE).write_text(json.dumps(saved))
    _reseal(ckpt, TASK_HEAD_FILE)
    assert export_head(open_checkpoint(ckpt)).label_names == ("yes", "no")  # the record, not config.yaml
    (ckpt / TASK_HEAD_FILE).unlink()
    _reseal(ckpt, TASK_HEAD_FILE)  # a checkpoint saved before the record existed
    record, note = open_checkpoint(ckpt).task_head()
    assert record == HeadRecord("classification", 2, "mean", "single_label_classification",
                                ("entailment", "not_entailment")) and note is None
    # a checkpoint saved when the label names were a finetune: key reads through the config's migration
    saved_config = yaml.safe_load((ckpt / "config.yaml").read_text())
    names = saved_config["finetune"]["options"].pop("label_names")
    saved_config["finetune"].update(label_names=["follows", "not"], problem_type="single_label_classification")
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved_config))
    _reseal(ckpt, "config.yaml")  # as that run sealed it
    assert names == ["entailment", "not_entailment"]
    assert open_checkpoint(ckpt).task_head()[0].id2label == ("follows", "not")


def test_an_exported_head_imports_back_with_its_record_and_the_same_logits(head_checkpoint, tmp_path):
    """The export's config.json carries the record (`biglm_task_head`); the import reads it,
    builds the head its entry names, seals the record with the checkpoint, and the imported
    model computes what the fine-tuned one did."""
    import torch

    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.export.convert_from_hf import from_hf
    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.inference.loading import load_megatron_checkpoint

    to_hf(head_checkpoint, tmp_path / "hf", progress=False)
    from_hf(tmp_path / "hf", tmp_path / "imported", progress=False)
    record, _ = open_checkpoint(head_checkpoint).task_head()
    assert open_checkpoint(tmp_path / "imported").task_head() == (record, None)
    tokens = torch.randint(5, 40, (3, 10))
    lengths = torch.tensor([10, 7, 4])
    logits = [load_megatron_checkpoint(path).model(tokens, split=None, valid_lengths=lengths)
              for path in (head_checkpoint, tmp_path / "imported")]
    assert logits[0].shape == (3, 2)
    torch.testing.assert_close(logits[1], logits[0], atol=0, rtol=0)
