"""Head classification through `python -m megatron_biglm.cli.finetune`'s main(): a tiny model
learns the synthetic "does the premise contain `cat`?" task (tests/fixtures/finetune_entry_fixtures.py,
balanced: chance 50 %) with the `classification` head on mean-pooled states, and the trained
model exports as HF EuroBertForSequenceClassification that predicts the same, under the same
label names (RTE's entailment / not_entailment), in a fresh process. A head that pooled
padding, a wrong loss or labels would not learn it (ACC_BAR: measured spread below)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from finetune_entry_fixtures import finetune_overrides, rows, write_task

# Accuracy bar (chance 0.5, balanced labels): over training.seed 1..5 best validation and test
# accuracy 1.00 (first validation, step 12: 0.86-0.97); bar = chance + 1/3 of the smallest gain
# over chance (0.5 + 0.5 / 3 = 0.67), also for the exported model on 24 fresh rows.
ACC_BAR = 0.65


def _finetune(tmp: Path, task_name: str, task: dict, **extra) -> tuple[Path, dict]:
    from megatron_biglm.cli.finetune import main

    run = tmp / "run"
    config = tmp / "ft.yaml"
    config.write_text(f"finetune: {{task: {task_name}}}\n")
    over = [o for o in finetune_overrides(task, run, **{"finetune.task": task_name, **extra})
            if not o.startswith("finetune.task=")]  # the config file names the task
    assert main(["--config", str(config), *over]) == 0
    return run, json.loads((run / "results.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("head_ft")
    task = write_task(tmp / "task")
    run, results = _finetune(tmp, "rte_head", task, **{"finetune.epochs": 5})
    return task, run, results


def test_head_recipe_learns_contains_cat(trained):
    _, _, results = trained
    assert results["best_metric"] >= ACC_BAR, results["validations"]
    assert results["test"]["test"]["accuracy"] >= ACC_BAR


def test_classification_head_ignores_padding_and_first_pooling_reads_position_0():
    from megatron_biglm.model.heads import build_head

    torch.manual_seed(0)
    head = build_head("classification", hidden_size=8, num_labels=3)
    hidden = torch.randn(6, 2, 8)  # [s, b, h]
    lengths = torch.tensor([4, 6])
    spoiled = hidden.clone()
    spoiled[4:, 0] = 1e4
    torch.testing.assert_close(head(None, spoiled, valid_lengths=lengths), head(None, hidden, valid_lengths=lengths))
    first = build_head("classification", hidden_size=8, num_labels=3, pooling="first")
    first.load_state_dict(head.state_dict())
    moved = hidden.clone()
    moved[1:] = torch.randn(5, 2, 8)
    torch.testing.assert_close(first(None, moved, valid_lengths=lengths), first(None, hidden, valid_lengths=lengths))
    with pytest.raises(ValueError, match="mean' or 'first"):
        build_head("classification", hidden_size=8, num_labels=3, pooling="last")


@pytest.mark.slow  # a fresh transformers process
def test_head_model_exports_as_sequence_classification_with_the_same_predictions(trained, tmp_path):
    from transformers import AutoTokenizer

    from head_export_fixtures import export_and_compare
    from megatron_biglm.finetune.kinds.head import HeadEncoder

    task, run, _ = trained
    tok = AutoTokenizer.from_pretrained(task["tokenizer"])
    enc = HeadEncoder(tok, ("premise", "hypothesis"), 16)
    examples = [enc.encode(r, r["label"]) for r in rows(24, 9)]
    tokens = torch.full((len(examples), 16), tok.pad_token_id, dtype=torch.long)
    for i, e in enumerate(examples):
        tokens[i, :e.length] = torch.tensor(e.input_ids)
    batch = {"tokens": tokens, "valid_lengths": torch.tensor([e.length for e in examples])}
    ours, theirs, read = export_and_compare(run, tmp_path / "hf", batch, "EuroBertForSequenceClassification")
    assert theirs.shape == ours.shape == (24, 2)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert theirs.argmax(-1).tolist() == ours.argmax(-1).tolist()
    assert (ours.argmax(-1) == torch.tensor([e.label for e in examples])).float().mean() >= ACC_BAR
    # config.json names the labels as the fine-tune did: plain transformers' argmax label names
    # are the names of our predictions
    names = ("entailment", "not_entailment")
    assert read["id2label"] == {"0": names[0], "1": names[1]}
    assert read["argmax_labels"] == [names[i] for i in ours.argmax(-1).tolist()]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["label2id"] == {n: i for i, n in enumerate(names)}
    assert yaml.safe_load((run / "config.yaml").read_text())["finetune"]["options"]["label_names"] == list(names)


class _Weights(dict):
    def shape(self, name):
        return self[name]


def _checkpoint(label_names, rows: int = 3):
    from types import SimpleNamespace

    from megatron_biglm.config import FinetuneConfig

    from megatron_biglm.config.task_head_migration import migrate_task_head

    weights = _Weights({"task_head.dense.weight": (8, 8), "task_head.classifier.weight": (rows, 8)})
    saved = SimpleNamespace(path="ckpt/iter_0000010", weights=lambda: weights,  # saved without task_head.json
                            run_config=SimpleNamespace(finetune=FinetuneConfig(
                                task="mnli_head", options={"label_names": label_names} if label_names else {})))
    saved.task_head = lambda: migrate_task_head(saved)
    return saved


def test_export_names_the_labels_from_the_saved_run_config():
    from transformers import AutoConfig

    from megatron_biglm.config import ConfigError
    from megatron_biglm.export.head_export import export_head

    head = export_head(_checkpoint(["entailment", "neutral", "contradiction"]))
    config = AutoConfig.for_model("bert")
    head.configure(config)
    assert config.id2label == {0: "entailment", 1: "neutral", 2: "contradiction"} and head.note is None
    assert config.label2id == {"entailment": 0, "neutral": 1, "contradiction": 2}
    unnamed = export_head(_checkpoint(None))  # a run from before the names were saved
    assert unnamed.label_names == ("LABEL_0", "LABEL_1", "LABEL_2") and "no finetune.options.label_names" in unnamed.note
    with pytest.raises(ConfigError, match="names 2 labels .* classifier has 3 rows"):
        export_head(_checkpoint(["yes", "no"]))


def test_label_names_are_the_data_sets_unless_set_and_must_fit(tmp_path):
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.run import plan_finetune

    task = write_task(tmp_path)
    base = [f"data.tokenizer={task['tokenizer']}", "finetune.task=rte_head",
            *(f"finetune.data.{k}={v}" for k, v in task["files"].items() if k != "test")]
    plan = plan_finetune(load_config(None, base))
    assert plan.config.finetune.options["label_names"] == ["entailment", "not_entailment"]
    assert load_config(None, base).finetune.options == {}  # derived by the plan, not loaded
    plan = plan_finetune(load_config(None, [*base, "finetune.options.label_names=[follows, 'no']"]))
    assert plan.config.finetune.options["label_names"] == ["follows", "no"]
    with pytest.raises(ConfigError, match="names 3 labels .* has 2: give one name per label"):
        plan_finetune(load_config(None, [*base, "finetune.options.label_names=[a, b, c]"]))
    with pytest.raises(ConfigError, match="distinct non-empty strings"):
        plan_finetune(load_config(None, [*base, "finetune.options.label_names=[a, a]"]))
