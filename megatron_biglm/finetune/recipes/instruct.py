"""InstructRecipe: masked-LM instruction tuning (seed 001 §3.1) through the one training loop.

Data: an `InstructionData` (built by `python -m megatron_biglm.cli.instruct_data build`),
viewed as `InstructionSamples`: train_steps × global_batch_size samples by global index
(epochs cycle with a fresh seeded order), each masked by `objective.instruct.mask_instruction`
(15 % of the input tokens, never template/special tokens; the whole target). The forward and
the loss are pretraining's (a per-token mean over every masked token, padding excluded), so
only the data differs. The `biglm` variant (the run config's `objective.variant`, or
`options["variant"]`) sets split = target start: input rows never see the target.

    InstructRecipe(task, tokenizer, options)   # the fine-tuning registry's constructor shape
    options: data (dir or InstructionData), valid_data (optional), variant, mask_ratio
"""
from __future__ import annotations

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.objective.instruct import INPUT_MASK_RATIO
from megatron_biglm.training.pretrain_recipe import PretrainRecipe
from megatron_biglm.training.recipe import RecipeData

from ..instruct.dataset import InstructionData, InstructionSamples


def _data(value) -> InstructionData:
    return value if isinstance(value, InstructionData) else InstructionData.load(value)


class InstructRecipe(PretrainRecipe):
    name = "instruct"

    def __init__(self, task=None, tokenizer=None, options: dict | None = None):
        options = dict(options or {})
        if options.get("data") is None:
            raise ValueError("the instruct recipe needs options['data']: a dataset dir written by "
                             "`python -m megatron_biglm.cli.instruct_data build` (or an InstructionData)")
        self.task, self.tokenizer, self.options = task, tokenizer, options

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:  # noqa: ARG002
        tokenizer = self.tokenizer
        if tokenizer is None:
            from megatron_biglm.data.tokenizer import load_tokenizer

            train = _data(self.options["data"])
            tokenizer = load_tokenizer(config.data.tokenizer or train.meta.get("tokenizer"))
        ids = TokenIds.from_tokenizer(tokenizer)
        variant = self.options.get("variant") or config.objective.resolved.variant
        common = dict(seq_length=config.data.seq_length, ids=ids, variant=variant,
                      global_batch=config.training.global_batch_size,
                      ratio=float(self.options.get("mask_ratio", INPUT_MASK_RATIO)))
        train = InstructionSamples(_data(self.options["data"]),
                                   config.schedule.train_steps * config.training.global_batch_size,
                                   seed=config.data.seed, **common)
        valid = None
        if self.options.get("valid_data") is not None:
            held = _data(self.options["valid_data"])
            valid = InstructionSamples(held, len(held), seed=config.data.seed + 1, **common)
        return RecipeData(train=train, valid=valid, tokenizer=tokenizer)
