"""Span QA through `python -m megatron_biglm.finetune`'s main(): a tiny model learns a
synthetic extractive task, "the answer is the word after the marker", in SQuAD-schema rows:
contexts of 20 random words hold one marker (`cat` or `dog`) followed by the answer word; the
question names the marker ("what follows cat ?"). With max_length 24 every context is cut into windows (doc stride 6), so
training sees windows without the answer and prediction pools the n-best over windows.
Chance EM is about 1/20; a head on the wrong positions, labels off by one or a loss over the
question would not reach EM 90 %."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from finetune_entry_fixtures import tiny_run, write_splits

WORDS = ["red", "blue", "green", "fish", "bird", "tree", "sun", "moon", "rock", "sand", "snow", "rain"]
MARKERS = ("cat", "dog")


def squad_rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(20)]
        marker = rng.choice(MARKERS)
        at = rng.randrange(19)
        words[at] = marker
        context = " ".join(words)
        start = len(" ".join(words[:at + 1])) + 1
        out.append({"id": f"q{seed}-{i}", "title": "t", "context": context,
                    "question": f"what follows {marker} ?",
                    "answers": {"text": [words[at + 1]], "answer_start": [start]}})
    return out


def write_span_task(folder: Path) -> dict:
    return write_splits(folder, squad_rows, (384, 48, 48), WORDS + list(MARKERS) + ["what", "follows", "?"])


def span_overrides(task: dict, run: Path, **extra) -> list[str]:
    over = {
        **tiny_run(task, run, lr=5e-3, batch=32, log_interval=10),
        "finetune.max_length": 24, "finetune.epochs": 4, "finetune.warmup_fraction": 0.1,
        "finetune.schedule": "linear", "finetune.test_split": "test", "finetune.eval_batch_size": 64,
        "finetune.options.doc_stride": 6, "finetune.options.max_query_length": 8,
        "finetune.options.max_answer_length": 3,
        **{f"finetune.data.{k}": v for k, v in task["files"].items()},
    }
    over.update(extra)
    return [f"{k}={v}" for k, v in over.items()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from megatron_biglm.finetune_main import main

    tmp = tmp_path_factory.mktemp("span_ft")
    task = write_span_task(tmp / "task")
    run = tmp / "run"
    (tmp / "ft.yaml").write_text("finetune: {task: squad}\n")
    assert main(["--config", str(tmp / "ft.yaml"), *span_overrides(task, run)]) == 0
    return task, run, json.loads((run / "results.json").read_text())


def test_span_recipe_learns_the_marker_task(trained):
    _, _, results = trained
    assert results["select"]["metric"] == "f1"
    assert results["best_valid"]["validation"]["exact_match"] >= 0.90, results["validations"]
    assert results["test"]["test"]["exact_match"] >= 0.90


def test_span_windows_need_the_stride(tmp_path):
    """The synthetic contexts really are split, and a window without the answer targets BOS."""
    from transformers import AutoTokenizer

    from megatron_biglm.finetune.tasks import SquadEncoder

    task = write_span_task(tmp_path)
    tok = AutoTokenizer.from_pretrained(task["tokenizer"])
    windows = SquadEncoder(tok, max_length=24, doc_stride=6, max_query_length=8).encode(squad_rows(1, 5)[0])
    assert len(windows) >= 2 and sum(w.has_answer for w in windows) >= 1
    assert all(w.start_position == w.end_position == 0 for w in windows if not w.has_answer)


@pytest.mark.slow  # a fresh transformers process
def test_span_model_exports_as_token_classification_with_the_same_answers(trained, tmp_path):
    """transformers has no EuroBertForQuestionAnswering: the span head exports as
    EuroBertForTokenClassification with labels (start, end); at valid positions its logits
    are ours, so the n-best answers are the same."""
    import torch
    from transformers import AutoTokenizer

    from head_export_fixtures import export_and_compare
    from megatron_biglm.finetune.tasks import SquadEncoder, squad_predictions

    task, run, _ = trained
    tok = AutoTokenizer.from_pretrained(task["tokenizer"])
    rows = squad_rows(16, 11)
    enc = SquadEncoder(tok, max_length=24, doc_stride=6, max_query_length=8)
    windows = [w for r in rows for w in enc.encode(r, training=False)]
    tokens = torch.full((len(windows), 24), tok.pad_token_id, dtype=torch.long)
    for i, w in enumerate(windows):
        tokens[i, :w.length] = torch.tensor(w.input_ids)
    lengths = torch.tensor([w.length for w in windows])
    ours, theirs = export_and_compare(run, tmp_path / "hf", {"tokens": tokens, "valid_lengths": lengths},
                                      "EuroBertForTokenClassification")
    valid = torch.arange(24)[None, :] < lengths[:, None]
    torch.testing.assert_close(theirs[valid], ours[valid], atol=1e-4, rtol=1e-4)
    contexts = {r["id"]: r["context"] for r in rows}

    def answers(logits):
        return squad_predictions(contexts, windows, list(logits[..., 0]), list(logits[..., 1]), max_answer_length=3)

    assert answers(theirs) == answers(ours)
    right = sum(answers(ours)[r["id"]] == r["answers"]["text"][0] for r in rows)
    assert right >= 13, right
