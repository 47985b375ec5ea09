"""The instruct kind: masked-LM instruction tuning (“Scaling Effects of Instruction Tuning” §3.1) through the one training loop.

Data: an `InstructionData` (built by `python -m megatron_biglm.cli.instruct_data build`),
viewed as `InstructionSamples`: train_steps × global_batch_size samples by global index
(epochs cycle with a fresh seeded order), each masked by `objective.instruct.mask_instruction`
(15 % of the input tokens, never template/special tokens; the whole target). The forward and
the loss are pretraining's (a per-token mean over every masked token, padding excluded), so
only the data differs. The `biglm` variant (the run config's `objective.variant`, or
`finetune.options.variant`) sets split = target start: input rows never see the target.

Through the fine-tuning entry (`finetune.task: {kind: instruct}`): `finetune.data.train` is a
built instruction dataset (a folder, or an `InstructionData`), each evaluation split another,
scored at every validation by the masked loss (the select metric, lower is better); without
evaluation splits the run trains and is not validated. The epochs count instruction samples.
Options (`InstructOptions`): variant, mask_ratio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch

from megatron_biglm.config import ConfigError
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.data.tokenizer import load_tokenizer
from megatron_biglm.objective.instruct import INPUT_MASK_RATIO
from megatron_biglm.training.pretrain_recipe import PretrainRecipe
from megatron_biglm.training.recipe import RecipeData

from ..instruct.dataset import InstructionData, InstructionSamples
from ..row_report import RowReport
from .base import FinetuneRecipe


@dataclass
class InstructOptions:
    variant: Optional[Literal["biglm", "mlm", "no_attn"]] = None   # default: the run's objective.variant
    mask_ratio: float = INPUT_MASK_RATIO


def _data(value) -> InstructionData:
    return value if isinstance(value, InstructionData) else InstructionData.load(value)


class InstructRecipe(FinetuneRecipe):
    name = "instruct"
    Options = InstructOptions
    default_metrics = {"single_label_classification": (("loss",), "loss")}
    reads_columns = False   # the data is an instruction dataset built by `cli.instruct_data`

    def __init__(self, task, tokenizer, options):
        super().__init__(task, tokenizer, options)
        self.masked_lm = PretrainRecipe()   # the forward and loss are pretraining's
        self.data: InstructionData | None = None
        self.common: dict = {}

    # ---- data -------------------------------------------------------------------------
    def eval_split_names(self) -> list[str]:
        return [s for s in super().eval_split_names() if self.options.data.get(s) is not None]

    def prepare(self, config) -> None:
        source = self.options.data.get(self.task.train_split)
        if source is None:
            raise ConfigError(f"finetune.data.{self.task.train_split}: the instruct kind trains on a dataset "
                              "built by `python -m megatron_biglm.cli.instruct_data build`")
        self.data = _data(source)
        self.train_examples = range(len(self.data))   # the epochs count its samples
        self.reports[self.task.train_split] = RowReport.all_kept(len(self.data))
        for name in self.eval_split_names():
            self.eval_examples[name] = _data(self.options.data[name])
            self.reports[name] = RowReport.all_kept(len(self.eval_examples[name]))
        self._settle(config, self.tokenizer)

    def _settle(self, config, tokenizer) -> None:
        self.common = dict(seq_length=config.data.seq_length, ids=TokenIds.from_tokenizer(tokenizer),
                           variant=self.opts.variant or config.objective.resolved.variant,
                           global_batch=config.training.global_batch_size, ratio=self.opts.mask_ratio)
        self.seed = config.data.seed

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:  # noqa: ARG002
        if self.data is None:
            if self.tokenizer is None:
                source = _data(self.options.data[self.task.train_split])
                self.tokenizer = load_tokenizer(config.data.tokenizer or source.meta.get("tokenizer"))
            self.prepare(config)
        train = InstructionSamples(self.data, config.schedule.train_steps * config.training.global_batch_size,
                                   seed=config.data.seed, **self.common)
        return RecipeData(train=train, valid=None, tokenizer=self.tokenizer)

    # ---- loss -------------------------------------------------------------------------
    def forward(self, model, batch: dict, device):
        return self.masked_lm.forward(model, batch, device)

    def loss_tokens(self, batch: dict) -> int:
        return self.masked_lm.loss_tokens(batch)

    def attention_splits(self, batch: dict) -> list | None:
        return self.masked_lm.attention_splits(batch)

    # ---- validation -------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_split(self, model, name: str, examples, device) -> dict[str, float]:  # noqa: ARG002
        """The per-token masked loss over every held-out sample (masked with a fixed seed)."""
        samples = InstructionSamples(examples, len(examples), seed=self.seed + 1, **self.common)
        total, count = 0.0, 0
        size = self.options.eval_batch_size
        for start in range(0, len(samples), size):
            batch = torch.utils.data.default_collate([samples[i] for i in range(start, min(start + size, len(samples)))])
            output, loss_func = self.forward(model, batch, device)
            loss_sum, tokens, _ = loss_func(output)
            total, count = total + float(loss_sum), count + int(tokens)
        return {"loss": total / max(count, 1)}

