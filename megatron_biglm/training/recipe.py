"""The recipe seam: what a training run learns, apart from how it is run.

The loop, the backends (megatron, DeepSpeed), parallelism, checkpoints and resilience are
shared; a recipe says what differs between pretraining, fine-tuning, instruction tuning or
retrieval (compare megatron's `pretrain(datasets_provider, model_provider, forward_step)`
and torchtitan's `TrainSpec`):

  (a) `build_data(config, model_config, dp_size)` -> `RecipeData`: the train/valid datasets
      (indexed by global sample, so `consumed_samples` resumes them), the collate function
      and the tokenizer;
  (b) `forward(model, batch, device)` -> `(output, loss_func)`: one micro-batch through one
      model chunk, exactly what megatron's pipeline schedules call a forward step. On the last
      stage `loss_func(output)` returns `(loss_sum, token_count, report)`: the loss is a sum
      over the micro-batch and `token_count` is what it is divided by, summed over the whole
      global batch (`calculate_per_token_loss`), so micro-batching and DP do not change it;
      `report[LOSS_KEY]` is the detached `[loss_sum, token_count]`;
      `loss_tokens(batch)` gives that count from the batch alone (DeepSpeed needs it before
      the forward);
  (c) `metric_names`: extra scalars. `report[name]` is a `[numerator, denominator]` pair;
      both are summed over micro-batches and ranks and `numerator / denominator` is logged
      under `name` with each training and validation record (e.g. accuracy = [correct, n]);
  (d) optionally `model_provider(pre_process, post_process, config, transformer_config)`: this
      rank's model chunk (override it for other heads); the default is BiGLMModel with its
      masked-LM head (`model.model_provider`).

Batches may carry `valid_lengths` ([b] real tokens per sample, right padding after them):
`padding_excluded` drops the padding from a loss mask, and BiGLMModel's `valid_lengths`
argument keeps padded keys out of every attention backend.

A recipe whose checkpoints must carry a record of their own (a fine-tune's task head) returns
it from `checkpoint_files()` ({file name: text}): every checkpoint seals it with its shards, so
the manifest covers it and the verifier checks it.

A recipe that holds training state (a curriculum position, say) returns it from
`state_dict()`; it is saved in the checkpoint under "recipe" and handed back to
`load_state_dict` on resume.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from megatron_biglm.model import model_provider

LOSS_KEY = "lm loss"


@dataclass
class RecipeData:
    train: object                 # a Dataset indexed by global sample index
    valid: object | None
    tokenizer: object | None = None
    collate_fn: Optional[Callable] = None   # None: data.collate.collate_masked_lm


class Recipe:
    """Base class: subclasses implement `build_data`, `forward` and `loss_tokens`."""

    name: str = "recipe"
    metric_names: tuple[str, ...] = ()

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:
        raise NotImplementedError

    def forward(self, model, batch: dict, device):
        raise NotImplementedError

    def loss_tokens(self, batch: dict) -> int:
        """The token count this micro-batch's loss is divided by (summed over the global batch)."""
        raise NotImplementedError

    def model_provider(self, pre_process: bool, post_process: bool, config, transformer_config):
        """This rank's bare model chunk (both backends wrap it); `config` is the BiGLMModelConfig."""
        return model_provider(pre_process=pre_process, post_process=post_process, config=config,
                              transformer_config=transformer_config)

    def attention_splits(self, batch: dict) -> list | None:
        """The per-sample split the attention restricts to (for the FLOPs count), or None
        when the model attends to every (valid) key."""
        return None

    def checkpoint_files(self) -> dict[str, str]:
        """This recipe's own records every checkpoint carries, {file name: text}; none by default."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - stateless by default
        pass


def padding_excluded(loss_mask: torch.Tensor, valid_lengths: torch.Tensor | None) -> torch.Tensor:
    """`loss_mask` with every position at or past `valid_lengths[b]` zeroed; the same tensor
    when the batch has no padding (valid_lengths None)."""
    if valid_lengths is None:
        return loss_mask
    positions = torch.arange(loss_mask.shape[1], device=loss_mask.device)
    keep = positions.unsqueeze(0) < valid_lengths.to(loss_mask.device).view(-1, 1)
    return loss_mask * keep.to(loss_mask.dtype)


def _metric_names(recipe: Recipe | None) -> tuple[str, ...]:
    return tuple(recipe.metric_names) if recipe is not None else ()


def report_width(recipe: Recipe | None) -> int:
    """Length of a summed report: [loss sum, tokens] then [numerator, denominator] per metric."""
    return 2 + 2 * len(_metric_names(recipe))


def add_report(total: torch.Tensor, report: dict, recipe: Recipe | None) -> torch.Tensor:
    """Accumulate one micro-batch's report into `total` (float64, `report_width` long)."""
    total[0:2] += report[LOSS_KEY].to(device=total.device, dtype=torch.float64)
    for i, name in enumerate(_metric_names(recipe)):
        total[2 + 2 * i:4 + 2 * i] += report[name].to(device=total.device, dtype=torch.float64)
    return total


def split_report(total: torch.Tensor, recipe: Recipe | None) -> tuple[float, int, dict]:
    """(mean loss, token count, {metric: value}) from a summed report (NaN where empty)."""
    loss_sum, count = float(total[0]), int(total[1])
    metrics = {}
    for i, name in enumerate(_metric_names(recipe)):
        num, den = float(total[2 + 2 * i]), float(total[3 + 2 * i])
        metrics[name] = num / den if den else float("nan")
    return (loss_sum / count if count else float("nan")), count, metrics
