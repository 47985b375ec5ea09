"""A fine-tune adds heads its start checkpoint lacks (the CMLM length head of seq2seq, the
classification head): `finetune.init_from` loads every tensor the checkpoint has and leaves
only those heads freshly initialised, naming them. The start checkpoint here is a verbalizer
fine-tune (a plain masked LM, as a pretraining run is); with an lr of 1e-30 (no fp32 weight
moves; lr 0 is refused) the new run's saved body must equal the start checkpoint's tensor for
tensor, while the new heads exist.
"""
from __future__ import annotations

import pytest
import torch

from finetune_entry_fixtures import finetune_overrides, tiny_run, write_task


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A task folder and a checkpoint root without task or length head (2 steps)."""
    from megatron_biglm.cli.finetune import finetune

    folder = tmp_path_factory.mktemp("fresh_heads")
    task = write_task(folder / "data", n_train=32, n_valid=8, n_test=8)
    finetune(None, finetune_overrides(task, folder / "start", **{"finetune.epochs": 1}))
    return task, folder / "start" / "checkpoints"


def _tensors(root):
    from megatron_biglm.checkpoint.dist_reader import DistCheckpointWeights
    from megatron_biglm.checkpoint.run_checkpoint import read_checkpoint

    saved = read_checkpoint(root)
    reader = DistCheckpointWeights(saved.dist_dir, num_layers=2)
    return {name: reader[name] for name in reader}


def _frozen_run(task, run, **extra) -> list[str]:
    over = {**tiny_run(task, run, lr=1e-30, batch=16, log_interval=4), "optimizer.min_lr": 0.0,
            "finetune.epochs": 1, "finetune.eval_batch_size": 16,
            "finetune.data.train": task["files"]["train"], "finetune.data.validation": task["files"]["validation"],
            **extra}
    return [f"{k}={v}" for k, v in over.items()]


@pytest.mark.parametrize("kind", ["seq2seq", "head"])
def test_init_from_a_checkpoint_without_the_new_head(start, tmp_path, capsys, kind):
    from megatron_biglm.cli.finetune import finetune

    task, root = start
    if kind == "seq2seq":  # the xsum schema over the same words: document -> itself
        import json
        rows = [json.loads(line) for line in open(task["files"]["train"])]
        path = tmp_path / "xsum.jsonl"
        path.write_text("".join(json.dumps({"id": str(i), "document": r["premise"], "summary": r["premise"]}) + "\n"
                                for i, r in enumerate(rows)))
        task = {**task, "files": {"train": str(path), "validation": str(path)}}
        extra = {"finetune.task": "xsum", "finetune.max_length": 16, "model.length_head_max": 8,
                 "finetune.options.max_target_length": 8, "finetune.options.eval_limit": 4}
        head = "length_head."
    else:
        extra = {"finetune.task": "rte_head", "finetune.max_length": 16}
        head = "task_head."
    run = tmp_path / "run"
    finetune(None, _frozen_run(task, run, **{"finetune.init_from": str(root), **extra}))
    note = capsys.readouterr().out
    assert "freshly initialised: " + head in note
    before, after = _tensors(root), _tensors(run / "checkpoints")
    assert not any(n.startswith(head) for n in before)
    assert any(n.startswith(head) for n in after)
    body = [n for n in before if not n.startswith(("task_head.", "length_head."))]
    assert body and set(body) <= set(after)
    for name in body:  # lr 1e-30: the body is exactly what was loaded
        assert torch.equal(before[name], after[name]), name


def test_a_head_stored_in_part_is_refused():
    from types import SimpleNamespace

    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.checkpoint.weights_only import absent_heads

    sharded = {n: SimpleNamespace(key=n) for n in ("decoder.w", "task_head.dense.weight", "task_head.out.weight",
                                                   "length_head.weight")}
    assert absent_heads(sharded, {"decoder.w"}) == ["task_head.dense.weight", "task_head.out.weight",
                                                     "length_head.weight"]
    assert absent_heads(sharded, set(sharded)) == []
    with pytest.raises(CheckpointError, match="only part of the model's task_head: task_head.out.weight"):
        absent_heads(sharded, {"decoder.w", "task_head.dense.weight"})
