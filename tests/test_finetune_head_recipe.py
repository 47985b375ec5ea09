"""Head classification through `python -m megatron_biglm.finetune`'s main(): a tiny model
learns the synthetic "does the premise contain `cat`?" task (tests/finetune_entry_fixtures.py,
balanced: chance 50 %) with the `classification` head on mean-pooled states, and the trained
model exports as HF EuroBertForSequenceClassification that predicts the same in a fresh
process. A head that pooled padding, a wrong loss or labels would not reach 95 %."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from finetune_entry_fixtures import finetune_overrides, rows, write_task


def _finetune(tmp: Path, task_name: str, task: dict, **extra) -> tuple[Path, dict]:
    from megatron_biglm.finetune_main import main

    run = tmp / "run"
    config = tmp / "ft.yaml"
    config.write_text(f"finetune: {{task: {task_name}}}\n")
    over = [o for o in finetune_overrides(task, run, **extra)
            if not o.startswith(("finetune.template=", "finetune.label_words=", "finetune.task="))]
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
    assert results["best_metric"] >= 0.95, results["validations"]
    assert results["test"]["test"]["accuracy"] >= 0.95


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
    from megatron_biglm.finetune.tasks import HeadEncoder

    task, run, _ = trained
    tok = AutoTokenizer.from_pretrained(task["tokenizer"])
    enc = HeadEncoder(tok, ("premise", "hypothesis"), 16)
    examples = [enc.encode(r, r["label"]) for r in rows(24, 9)]
    tokens = torch.full((len(examples), 16), tok.pad_token_id, dtype=torch.long)
    for i, e in enumerate(examples):
        tokens[i, :e.length] = torch.tensor(e.input_ids)
    batch = {"tokens": tokens, "valid_lengths": torch.tensor([e.length for e in examples])}
    ours, theirs = export_and_compare(run, tmp_path / "hf", batch, "EuroBertForSequenceClassification")
    assert theirs.shape == ours.shape == (24, 2)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=1e-4)
    assert theirs.argmax(-1).tolist() == ours.argmax(-1).tolist()
    assert (ours.argmax(-1) == torch.tensor([e.label for e in examples])).float().mean() >= 0.9
