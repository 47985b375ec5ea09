"""A new task kind is one file and one registry line: a toy kind written here into its own
module (outside the package), registered with `register_kind`, learns a task through
`biglm-finetune`'s main(), with the one loop, validation and results.json of every kind.

The toy kind reads one text field, appends a `<mask>` and reads the answer off the masked-LM
head's logits for "yes" and "no" at that slot (full attention, no template). The task is
"does the text contain `cat`?" (balanced, chance 0.5; `finetune_entry_fixtures.rows`).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from finetune_entry_fixtures import tiny_run, write_task

TOY_KIND = '''
"""A toy task kind: the answer to a text is "yes" or "no" at a `<mask>` after it."""
import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.finetune.kinds.base import LabelRecipe, accuracy_loss, gold_labels


class MaskAnswer(LabelRecipe):
    name = "mask_answer"
    metric_names = ("accuracy",)
    num_classes = 2

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        self.ids = TokenIds.from_tokenizer(tokenizer)
        self.answers = tokenizer.convert_tokens_to_ids(["yes", "no"])

    def encode(self, rows, report, training):
        out = []
        for row in rows:
            text = self.tokenizer(row[self.task.fields[0]], add_special_tokens=False)["input_ids"]
            ids = [self.ids.bos_id, *text[:self.options.max_length - 3], self.ids.mask_id, self.ids.eos_id]
            out.append(Example(ids, row.get(self.task.label_field)))
        return out

    def collate(self, examples):
        tokens = torch.full((len(examples), self.options.max_length), self.ids.pad_id, dtype=torch.long)
        for i, e in enumerate(examples):
            tokens[i, :len(e.ids)] = torch.tensor(e.ids)
        return {"tokens": tokens, "valid_lengths": torch.tensor([len(e.ids) for e in examples]),
                "mask_at": torch.tensor([len(e.ids) - 2 for e in examples]),
                "labels": torch.tensor([-1 if e.label is None else e.label for e in examples])}

    def scores(self, batch, logits):
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, batch["mask_at"].to(logits.device)][:, self.answers].float()

    def _loss(self, batch, logits):
        scores = self.scores(batch, logits)
        labels = gold_labels(batch, logits.device)
        loss_sum = torch.nn.functional.cross_entropy(scores, labels, reduction="sum")
        return accuracy_loss(loss_sum, scores, labels)


class Example:
    def __init__(self, ids, label):
        self.ids, self.label = ids, label
'''

# chance is 0.5; the verbalizer on the same data reaches 0.98-1.00 (test_finetune_entry's bar)
ACC_BAR = 0.65


def test_a_toy_kind_in_one_file_and_one_registry_line_learns_through_biglm_finetune(tmp_path, monkeypatch):
    from megatron_biglm.cli.finetune import main
    from megatron_biglm.finetune import kinds
    from megatron_biglm.finetune.kinds import register_kind

    (tmp_path / "toy_kind.py").write_text(textwrap.dedent(TOY_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(kinds, "KINDS", dict(kinds.KINDS))  # the registration ends with the test

    register_kind("toy", "toy_kind:MaskAnswer")   # the one registry line

    task = write_task(tmp_path / "data")
    run = tmp_path / "run"
    config = tmp_path / "toy.yaml"   # what a user writes: the task is declared with the new kind
    config.write_text("finetune:\n  task: {kind: toy, fields: [premise], labels: [cat, no_cat]}\n")
    over = {**tiny_run(task, run, lr=3e-3, batch=16, log_interval=4),
            "finetune.max_length": 12, "finetune.epochs": 4, "finetune.test_split": "test",
            **{f"finetune.data.{split}": path for split, path in task["files"].items()}}
    assert main(["--config", str(config), *(f"{k}={v}" for k, v in over.items())]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["finished"] and results["select"] == {"split": "validation", "metric": "accuracy"}
    accuracies = [v["valid"]["validation"]["accuracy"] for v in results["validations"]]
    assert results["best_metric"] == max(accuracies) >= ACC_BAR, accuracies
    assert results["test"]["test"]["accuracy"] >= ACC_BAR
    saved = (run / "config.yaml").read_text()
    assert "kind: toy" in saved


def test_a_declaration_may_name_a_kind_class_and_an_unknown_kind_names_the_nearest(tmp_path, monkeypatch):
    from megatron_biglm.finetune.kinds import KINDS, kind_class
    from megatron_biglm.finetune.kinds.base import FinetuneRecipe
    from megatron_biglm.finetune.tasks import get_task
    from megatron_biglm.finetune.tasks.declaration import TaskDeclarationError

    # every registered kind imports (the registry names them as text) and only two score zero-shot
    assert all(issubclass(kind_class(name), FinetuneRecipe) for name in KINDS)
    assert [name for name in KINDS if kind_class(name).scores_zero_shot] == ["verbalizer", "contrastive"]

    (tmp_path / "toy_kind.py").write_text(textwrap.dedent(TOY_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    task = get_task({"kind": "toy_kind:MaskAnswer", "fields": ["text"], "labels": ["a", "b"]})
    assert (task.kind, task.fields, task.metrics) == ("toy_kind:MaskAnswer", ("text",), ("accuracy",))
    with pytest.raises(TaskDeclarationError, match="unknown task kind 'verbaliser' \\(did you mean 'verbalizer'"):
        get_task({"kind": "verbaliser", "fields": ["text"]})
    with pytest.raises(TaskDeclarationError, match="not a FinetuneRecipe subclass"):
        get_task({"kind": "toy_kind:Example", "fields": ["text"]})


MINIMAL_KIND = '''
"""A kind that writes only the methods of `kinds.protocol.TaskKind`: every other method is the
recipe's default."""
import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.finetune.kinds.base import FinetuneRecipe, accuracy_loss, gold_labels


class Minimal(FinetuneRecipe):
    def encode(self, rows, report, training):
        ids = TokenIds.from_tokenizer(self.tokenizer)
        out = []
        for row in rows:
            text = self.tokenizer(row[self.task.fields[0]], add_special_tokens=False)["input_ids"]
            out.append(([ids.bos_id, *text[:self.options.max_length - 3], ids.mask_id, ids.eos_id],
                        row.get(self.task.label_field)))
        return out

    def collate(self, examples):
        pad = TokenIds.from_tokenizer(self.tokenizer).pad_id
        tokens = torch.full((len(examples), self.options.max_length), pad, dtype=torch.long)
        for i, (ids, _) in enumerate(examples):
            tokens[i, :len(ids)] = torch.tensor(ids)
        return {"tokens": tokens, "valid_lengths": torch.tensor([len(ids) for ids, _ in examples]),
                "mask_at": torch.tensor([len(ids) - 2 for ids, _ in examples]),
                "labels": torch.tensor([-1 if label is None else label for _, label in examples])}

    def _scores(self, batch, logits):
        answers = self.tokenizer.convert_tokens_to_ids(["yes", "no"])
        rows = torch.arange(logits.shape[0], device=logits.device)
        return logits[rows, batch["mask_at"].to(logits.device)][:, answers].float()

    def _loss(self, batch, logits):
        scores = self._scores(batch, logits)
        labels = gold_labels(batch, logits.device)
        return accuracy_loss(torch.nn.functional.cross_entropy(scores, labels, reduction="sum"), scores, labels)

    @torch.no_grad()
    def evaluate_split(self, model, name, examples, device):
        batch = self.collate(examples)
        scores = self._scores(batch, self.logits(model, batch, device))
        return {"accuracy": float((scores.argmax(-1).cpu() == batch["labels"]).float().mean())}


class NoLoss(FinetuneRecipe):
    def encode(self, rows, report, training):
        return []
'''


@pytest.mark.slow
def test_a_kind_writing_only_the_required_methods_runs(tmp_path, monkeypatch):
    from megatron_biglm.cli.finetune import main
    from megatron_biglm.finetune.kinds import kind_class
    from megatron_biglm.finetune.kinds.protocol import TaskKind

    (tmp_path / "minimal_kind.py").write_text(textwrap.dedent(MINIMAL_KIND))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(kind_class("minimal_kind:Minimal").__new__(kind_class("minimal_kind:Minimal")), TaskKind)
    with pytest.raises(ValueError, match="does not write collate, _loss, evaluate_split"):
        kind_class("minimal_kind:NoLoss")

    task = write_task(tmp_path / "data", n_train=32, n_valid=16, n_test=16)
    run = tmp_path / "run"
    config = tmp_path / "minimal.yaml"
    config.write_text("finetune:\n  task: {kind: 'minimal_kind:Minimal', fields: [premise], labels: [cat, no_cat]}\n")
    over = {**tiny_run(task, run, lr=3e-3, batch=16, log_interval=1),
            "finetune.max_length": 12, "finetune.epochs": 1, "finetune.test_split": "test",
            **{f"finetune.data.{split}": path for split, path in task["files"].items()}}
    assert main(["--config", str(config), *(f"{k}={v}" for k, v in over.items())]) == 0
    results = json.loads((run / "results.json").read_text())
    assert results["finished"] and 0.0 <= results["test"]["test"]["accuracy"] <= 1.0
