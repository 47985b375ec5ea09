"""A task head that owns weights, described once: `TaskHead`.

Everything outside the training loop that must know a head reads its entry, never its name:
the head model builds `module` (`head_model.py`), the checkpoint's `task_head.json` (a
`HeadRecord`) rebuilds it through `options_of`, the HF export writes it as `hf_class` with the
weight-table rows derived from `hf_names` (`export/weight_table.head_rows`) and the config
fields of `hf_config`, and the import reads those back. As transformers' ModernBERT keeps a
head's facts in its config, the export's config.json carries the record (`biglm_task_head`).

A new head is one file holding its module and its entry, and one line:
`register_head(ENTRY)` (`model/heads.py`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from megatron_biglm.checkpoint.task_head import HeadRecord

#: config.json's key holding the head's record (`HeadRecord.to_json()`), beside HF's own fields
HF_RECORD_KEY = "biglm_task_head"


@dataclass(frozen=True)
class TaskHead:
    """One head type with weights of its own.

    name         the record's and the registry's name (`HeadRecord.head`)
    module       the head's `nn.Module` class, built as `module(hidden_size=h, **options)` and
                 called as the `Head` Protocol (`model/heads.py`)
    hf_class     the transformers class its export loads as (e.g. EuroBertForSequenceClassification)
    hf_names     the module's tensor prefix -> the HF class's (e.g. {"dense": "dense"}): the
                 weight-table rows, with shapes read off the module itself
    options_of   a record -> the module's options (how a checkpoint rebuilds the head)
    hf_config    a record -> the HF config fields the class reads besides the labels (pooling,
                 problem_type); `id2label`/`label2id` and `architectures` are written for all
    doc          one line for listings
    """

    name: str
    module: type
    hf_class: str
    hf_names: Mapping[str, str]
    options_of: Callable[[HeadRecord], dict]
    hf_config: Callable[[HeadRecord], dict]
    doc: str = ""
    owns_weights: bool = True

    @property
    def build(self) -> type:
        return self.module

    def tensor_shapes(self, hidden_size: int, options: dict) -> dict[str, tuple[int, ...]]:
        """The module's tensors (names relative to the head) and their shapes, built on the meta
        device (no memory, no initialisation)."""
        with torch.device("meta"):
            module = self.module(hidden_size=hidden_size, **options)
        return {name: tuple(t.shape) for name, t in module.state_dict().items()}

    def hf_name(self, tensor: str) -> str:
        """The HF name of one of the module's tensors, by its longest mapped prefix."""
        prefix = max((p for p in self.hf_names if tensor == p or tensor.startswith(p + ".")),
                     key=len, default=None)
        if prefix is None:
            raise ValueError(f"head {self.name!r}: tensor {tensor!r} has no HF name; add its prefix "
                             f"to the entry's hf_names ({dict(self.hf_names)})")
        return self.hf_names[prefix] + tensor[len(prefix):]

    def hf_fields(self, record: HeadRecord) -> dict:
        """Every config.json field the export writes for `record`."""
        names = [str(n) for n in record.id2label]
        return {"architectures": [self.hf_class], "id2label": dict(enumerate(names)),
                "label2id": {n: i for i, n in enumerate(names)}, **self.hf_config(record),
                HF_RECORD_KEY: record.to_json()}
