"""The recipe seam is real: a recipe written here, not pretraining, trains through the common
loop (megatron backend) at world size 1 and 2 (DP, torchrun/gloo) and resumes exactly.

The recipe: plain 15 % masked LM on right-padded windows (`valid_lengths` end to end), with
another loss weighting than pretraining's per-token mean: every sample counts once (its
masked tokens' mean cross entropy), so the loss's token count is the number of samples. A
sloppy dataset also marks a padding position in the loss mask; padding must not count.
The logged loss is checked against a reference computed here from the model's per-token
losses, so a loop that reduced per token, or a loss that counted padding, fails.
"""
from __future__ import annotations

import hashlib
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from megatron_biglm.training.recipe import LOSS_KEY, Recipe, RecipeData, padding_excluded
from train_fixtures import tiny_overrides, train_data, train_records  # noqa: F401 (fixture)

STEPS, MASK_RATE = 6, 0.15


class PaddedWindows(torch.utils.data.Dataset):
    """Windows of the corpus, right-padded to seq_length (valid length varies per sample),
    15 % of the real positions masked; sample i is a pure function of (seed, i)."""

    def __init__(self, flat: np.ndarray, first: int, count: int, seq: int, mask_id: int, pad_id: int, seed: int):
        self.flat, self.first, self.count, self.seq = flat, first, count, seq
        self.mask_id, self.pad_id, self.seed = mask_id, pad_id, seed

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        seq, start = self.seq, ((self.first + i) * self.seq) % (len(self.flat) - self.seq)
        valid = seq - 7 * ((self.first + i) % 4)  # 64, 57, 50, 43
        rng = np.random.default_rng([self.seed, self.first + i])
        labels = np.full(seq, self.pad_id, dtype=np.int64)
        labels[:valid] = self.flat[start:start + valid]
        masked = np.zeros(seq, dtype=bool)
        masked[:valid] = rng.random(valid) < MASK_RATE
        masked[rng.integers(0, valid)] = True  # at least one target per sample
        tokens = np.where(masked, self.mask_id, labels)
        loss_mask = masked.astype(np.float32)
        if valid < seq:
            loss_mask[seq - 1] = 1.0  # the sloppy part: a padding position marked as a target
        return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
                "loss_mask": torch.from_numpy(loss_mask), "split": 0, "valid_lengths": valid}


class PerSampleMLM(Recipe):
    """Each sample's masked-token mean cross entropy, averaged over samples."""

    name = "per_sample_mlm"
    metric_names = ("token_ce",)  # the plain per-token mean, for comparison

    def __init__(self, record: list | None = None):
        self.record = record  # (per-token loss, batch) of every micro-batch, to check against

    def build_data(self, config, model_config, dp_size):  # noqa: ARG002
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        from megatron_biglm.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(config.data.tokenizer)
        corpus = IndexedDataset(config.data.blend[0])
        flat = np.concatenate([np.asarray(corpus[i]) for i in range(len(corpus))]).astype(np.int64)
        seq, n = config.data.seq_length, config.schedule.train_steps * config.training.global_batch_size
        make = partial(PaddedWindows, flat, seq=seq, mask_id=tokenizer.mask_token_id,
                       pad_id=tokenizer.pad_token_id, seed=config.data.seed)
        return RecipeData(train=make(0, n), valid=make(n, config.training.global_batch_size), tokenizer=tokenizer)

    def forward(self, model, batch, device):
        valid = batch["valid_lengths"].to(device)
        loss_mask = padding_excluded(batch["loss_mask"].to(device), valid)
        output = model(batch["tokens"].to(device), split=None, valid_lengths=valid,
                       labels=batch["labels"].to(device), loss_mask=loss_mask)
        return output, partial(self._loss, loss_mask, batch)

    def _loss(self, loss_mask, batch, output):
        per_sample = loss_mask.sum(dim=1)
        loss_sum = (output.float() * loss_mask / per_sample.clamp(min=1).unsqueeze(1)).sum()
        count = (per_sample > 0).sum().to(torch.int)
        if self.record is not None:
            self.record.append((output.detach().clone(), batch))
        token_ce = torch.stack([(output.float() * loss_mask).sum().detach(), loss_mask.sum()])
        return loss_sum, count, {LOSS_KEY: torch.stack([loss_sum.detach(), count.float()]), "token_ce": token_ce}

    def loss_tokens(self, batch):
        return int((padding_excluded(batch["loss_mask"], batch["valid_lengths"]).sum(dim=1) > 0).sum())


class FinalWeights:
    """A loop callback (`on_step` gets the live model): a digest of the weights after the last step."""

    def __init__(self, last_step: int):
        self.last_step, self.digest = last_step, None

    def on_step(self, step, loop_state, ctx):  # noqa: ARG002
        if step == self.last_step:
            params = [p.detach().contiguous().view(-1) for p in ctx.model_chunks[0].module.parameters()]
            self.digest = hashlib.sha256(torch.cat(params).numpy().tobytes()).hexdigest()


def _overrides(data_dirs: dict, run_dir, **extra):
    from train_fixtures import TrainData

    return tiny_overrides(TrainData(**data_dirs), run_dir, steps=STEPS, **{
        "checkpoint.save_interval": 3, "training.eval_interval": 3, "training.eval_iters": 1, **extra})


def run_straight_and_resumed(data_dirs: dict, out: str) -> dict:
    """Train STEPS steps straight, and 3 + resume to STEPS; loss, grad norm, weights of both."""
    from megatron_biglm.cli.train import train

    result = {}
    for name, legs in (("straight", [None]), ("resumed", [3, None])):
        run = Path(out) / name
        weights = FinalWeights(STEPS)
        for exit_after in legs:
            extra = {"training.exit_after_steps": exit_after} if exit_after else {}
            res = train(None, _overrides(data_dirs, run, **extra), recipe=PerSampleMLM(), callbacks=[weights])
        result[name] = {"resumed_from": res.resumed_from, "weights": weights.digest,
                        "steps": {str(s): [r["loss"], r["grad_norm"], r["token_ce"]]
                                  for s, r in train_records(run).items()}}
    return result


def worker(data_dirs: dict, out: str) -> dict:
    """One torchrun rank (DP=2): the same straight and resumed runs."""
    return run_straight_and_resumed(data_dirs, out)


def _data_dirs(train_data):
    return {"tokenizer": train_data.tokenizer, "prefix": train_data.prefix}


def test_custom_recipe_loss_is_what_the_loop_reports(train_data, tmp_path):
    from megatron_biglm.cli.train import train
    from megatron_biglm.training.metrics import read_metrics

    record: list = []
    run = tmp_path / "run"
    train(None, _overrides(_data_dirs(train_data), run, **{"schedule.train_steps": 3, "schedule.warmup_steps": 1}),
          recipe=PerSampleMLM(record))
    first = record[2:4]  # step 1's 2 micro-batches of 4 (the 2 before them: validation at step 0)
    per_sample, ce_sum, ce_n = [], 0.0, 0
    for output, batch in first:
        for b in range(output.shape[0]):
            n = int(batch["valid_lengths"][b])
            assert torch.all(output[b, n:] == 0), "padding positions must not be predicted"
            targets = [i for i in range(n) if batch["loss_mask"][b, i] != 0]
            losses = [float(output[b, i]) for i in targets]
            per_sample.append(sum(losses) / len(losses))
            ce_sum, ce_n = ce_sum + sum(losses), ce_n + len(losses)
    logged = train_records(run)[1]
    assert logged["loss"] == pytest.approx(sum(per_sample) / len(per_sample), rel=1e-6)
    assert logged["token_ce"] == pytest.approx(ce_sum / ce_n, rel=1e-6)
    assert not math.isclose(logged["loss"], logged["token_ce"], rel_tol=1e-4)  # the weighting differs
    valid = [r for r in read_metrics(run / "metrics.jsonl") if r.get("kind") == "valid"]
    assert [r["step"] for r in valid] == [0, 3] and all(math.isfinite(r["token_ce"]) for r in valid)


@pytest.mark.slow
def test_custom_recipe_trains_at_world_1_and_2_and_resumes_exactly(train_data, tmp_path):
    from torchrun_util import run_function

    one = run_straight_and_resumed(_data_dirs(train_data), str(tmp_path / "w1"))
    two = run_function("tests/training/test_recipe_seam.py:worker", nproc=2, timeout=600,
                       kwargs={"data_dirs": _data_dirs(train_data), "out": str(tmp_path / "w2")}).check().results[0]
    for res in (one, two):
        assert res["resumed"]["resumed_from"].endswith("iter_0000003")
        assert sorted(res["straight"]["steps"], key=int) == [str(s) for s in range(1, STEPS + 1)]
        assert res["resumed"]["steps"] == res["straight"]["steps"]  # loss, grad norm, metric: bit for bit
        assert res["resumed"]["weights"] == res["straight"]["weights"] is not None
    losses = [one["straight"]["steps"][str(s)][0] for s in range(1, STEPS + 1)]
    assert losses[-1] < losses[0]
    assert [two["straight"]["steps"][str(s)][0] for s in range(1, STEPS + 1)] == pytest.approx(losses, rel=1e-5)
