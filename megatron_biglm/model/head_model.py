"""`BiGLMHeadModel`: the BiGLM trunk with a task head that owns weights (a `TaskHead` entry:
classification, span, or one registered from outside).

Why a subclass and not a second model: the trunk, its parameter names, parallelism, checkpoints
and the attention rule stay BiGLMModel's; only the last step differs. The head sits on the last
pipeline stage as the submodule `task_head` (its weights are `task_head.*`, rows of
`export/weight_table.head_rows`), and reads the final hidden states instead of the masked-LM
projection (the tied output layer stays, unused, so a masked-LM checkpoint loads into it).

  model(input_ids, *, split=None, valid_lengths=None) -> the head's output on the last stage
  (classification: logits [b, labels]; span: [b, s, 2]), the hidden states [s, b, h] elsewhere.
"""
from __future__ import annotations

from typing import Optional

import torch

from megatron_biglm.checkpoint.task_head import HeadRecord

from .biglm_model import BiGLMModel
from .heads import build_head, task_head
from .provider import as_model_config


class BiGLMHeadModel(BiGLMModel):
    def __init__(self, config, model_config, head: str, head_options: Optional[dict] = None,
                 pre_process: bool = True, post_process: bool = True, vp_stage=None, pg_collection=None):
        task_head(head)  # a registered task head, or a clear refusal
        super().__init__(config, model_config, pre_process=pre_process, post_process=post_process,
                         vp_stage=vp_stage, pg_collection=pg_collection)
        self.head_name, self.head_options = head, dict(head_options or {})
        if self.post_process:
            self.task_head = build_head(head, hidden_size=config.hidden_size, **self.head_options)

    def forward(self, input_ids, position_ids=None, *, split=None,
                valid_lengths: Optional[torch.Tensor] = None, decoder_input=None, **unused) -> torch.Tensor:
        if unused:
            raise ValueError(f"a {self.head_name} head model takes no {sorted(unused)} (no masked-LM output)")
        hidden = super().forward(input_ids, position_ids, split=split, valid_lengths=valid_lengths,
                                 decoder_input=decoder_input, return_hidden=True)
        if not self.post_process:
            return hidden
        return self.task_head(self, hidden.transpose(0, 1), valid_lengths=valid_lengths)


def head_model_provider(head: str, head_options: Optional[dict] = None):
    """A `model_provider` (the Recipe seam's signature) building `BiGLMHeadModel` chunks."""

    def provider(pre_process: bool, post_process: bool, config, transformer_config):
        return BiGLMHeadModel(transformer_config, as_model_config(config), head, head_options,
                              pre_process=pre_process, post_process=post_process)

    return provider


def head_of_record(record) -> tuple[str, dict] | None:
    """(head name, head options) that build the model a checkpoint's task-head record
    (`checkpoint/task_head.py`) describes, read through the head's entry, or None for the
    masked-LM model (no record, or an embedder's, which pools the trunk's hidden states and
    owns no weights)."""
    if not isinstance(record, HeadRecord):
        return None
    return record.head, task_head(record.head).options_of(record)
