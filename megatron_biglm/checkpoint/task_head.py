"""What a fine-tune's checkpoint says about its task head: `task_head.json`, beside its
config.yaml, sealed with every checkpoint of the run that trained it (in its manifest, so the
verifier checks it) and read by every export and loader.

Two shapes, one file:

  HeadRecord      {head, num_labels, pooling, problem_type, id2label}   a head that owns
                  weights (`classification`, `span`): which `BiGLMHeadModel` head to build
                  and what the HF export's config.json says about its outputs;
  EmbedderRecord  {pooling, normalize, prompts, max_length}   a contrastive fine-tune: how
                  its texts are embedded (the sentence-transformers export repeats exactly that).

A masked-LM checkpoint (pretraining, verbalizer, seq2seq, instruct) has no record. The
embedder's defaults are defined here once; the contrastive recipe's options take theirs from
them, so training and export cannot drift apart.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from .dirs import CheckpointError

TASK_HEAD_FILE = "task_head.json"

#: the prefixes of E5-style retrieval models: the model is told which side a text is on.
DEFAULT_PROMPTS = {"query": "query: ", "passage": "passage: "}


@dataclass(frozen=True)
class HeadRecord:
    head: str                       # a registered task head (model/task_heads.py): classification, span, ...
    num_labels: int
    pooling: str = "mean"           # classification: over the valid tokens, or "first"
    problem_type: str = "single_label_classification"   # HF's: also regression, multi_label_classification
    id2label: tuple = ()            # label names in index order

    def to_json(self) -> dict:
        return {"head": self.head, "num_labels": self.num_labels, "pooling": self.pooling,
                "problem_type": self.problem_type, "id2label": {str(i): n for i, n in enumerate(self.id2label)}}


@dataclass(frozen=True)
class EmbedderRecord:
    pooling: str = "mean"           # model/pooling.py's names: mean, first (alias cls), last
    normalize: bool = True
    prompts: dict = field(default_factory=lambda: dict(DEFAULT_PROMPTS))   # {query, passage} prefixes
    max_length: int | None = None   # the tokens each text keeps

    def to_json(self) -> dict:
        return {"embedder": dataclasses.asdict(self)}


def task_head_text(record: HeadRecord | EmbedderRecord) -> str:
    """The text of `task_head.json` holding `record` (sealed with each checkpoint of the run)."""
    return json.dumps(record.to_json(), indent=1) + "\n"


def read_task_head(folder) -> HeadRecord | EmbedderRecord | None:
    """The record in `folder`, or None when the checkpoint has none (see `config.trained_checkpoint`
    for what a checkpoint without one is read as)."""
    path = Path(folder) / TASK_HEAD_FILE
    if not path.is_file():
        return None
    try:
        return record_from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{path} is not a task-head record ({exc}); restore it from a copy of the "
                              f"checkpoint, or delete it to read the checkpoint by its saved config") from None


def record_from_json(data: dict) -> HeadRecord | EmbedderRecord:
    """The record `to_json` wrote (task_head.json, or an HF export's config.json key); a
    malformed one raises ValueError, TypeError or KeyError."""
    if "embedder" in data:
        return EmbedderRecord(**data["embedder"])
    data = dict(data)
    id2label = data.pop("id2label", {})
    return HeadRecord(**data, id2label=tuple(id2label[str(i)] for i in range(len(id2label))))
