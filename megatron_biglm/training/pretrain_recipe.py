"""BiGLM pretraining as a recipe: the indexed-corpus masked-LM datasets and the sparse
masked-LM loss (the default recipe of `train()`; see recipe.py for the seam).

`split` alone says how attention is restricted (0 = full attention: the variants without the
restriction emit 0). It goes to the model as the loader's CPU tensor: the model checks it
there, without a device sync, then moves it. The loss's predicted rows come from the host
mask too (`loss.predicted_rows`).
"""
from __future__ import annotations

from functools import partial

from megatron_biglm.model.loss import masked_lm_loss_func, predicted_rows
from megatron_biglm.training import build
from megatron_biglm.training.recipe import Recipe, RecipeData, padding_excluded


class PretrainRecipe(Recipe):
    name = "pretrain"

    def build_data(self, config, model_config, dp_size: int) -> RecipeData:  # noqa: ARG002
        """The samples the schedule consumes: train_steps global batches, `eval_iters` of them
        for validation, the annealing blend from the step the WSD decay starts."""
        gbs, t = config.training.global_batch_size, config.training
        anneal = config.anneal_start_step if config.data.anneal_blend else None
        data = build.build_data(
            config.data, config.objective.resolved, model_config, train_samples=config.schedule.train_steps * gbs,
            valid_samples=t.eval_iters * gbs if t.eval_iters > 0 else 0,
            anneal_start_sample=anneal * gbs if anneal is not None else None)
        return RecipeData(train=data.train, valid=data.valid, tokenizer=data.tokenizer)

    def forward(self, model, batch: dict, device):
        tokens = batch["tokens"].to(device, non_blocking=True)
        host_mask = padding_excluded(batch["loss_mask"], batch.get("valid_lengths"))
        loss_mask = host_mask.to(device, non_blocking=True)
        padding = {}
        if batch.get("valid_lengths") is not None:
            # the model checks the host tensor (no sync) and moves what it needs
            padding["valid_lengths"] = batch["valid_lengths"]
        output = model(tokens, split=batch["split"], labels=batch["labels"].to(device, non_blocking=True),
                       loss_mask=loss_mask, predicted_rows=predicted_rows(host_mask), **padding)
        return output, partial(masked_lm_loss_func, loss_mask)

    def loss_tokens(self, batch: dict) -> int:
        return int((padding_excluded(batch["loss_mask"], batch.get("valid_lengths")) != 0).sum())

    def attention_splits(self, batch: dict) -> list | None:
        return batch["split"].tolist()
