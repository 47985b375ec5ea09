"""Fixtures for the training-driver tests: a real tokenizer and indexed Shakespeare data,
made with the project's own tokenizer trainer and preprocessing tool (the quickstart path),
the overrides of a tiny, fast CPU run, and readers of what a run logged."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

VOCAB = 2048


@dataclass
class TrainData:
    tokenizer: str
    prefix: str


@pytest.fixture(scope="session")
def train_data(corpus_jsonl, tmp_path_factory) -> TrainData:
    from megatron_biglm.data.preprocess import preprocess
    from megatron_biglm.data.tokenizer import load_tokenizer, train_bpe_tokenizer

    out = tmp_path_factory.mktemp("train_data")
    tok_dir = train_bpe_tokenizer([str(corpus_jsonl)], VOCAB, out / "tokenizer", json_keys=("text",))
    preprocess([str(corpus_jsonl)], str(out / "shk"), load_tokenizer(str(tok_dir)), json_keys=("text",),
               workers=1, append_eod=True)
    return TrainData(str(tok_dir), str(out / "shk_text_document"))


def tiny_overrides(data: TrainData, run_dir: Path, steps: int = 20, **extra) -> list[str]:
    """A 2-layer, 64-wide model on 64-token windows: a step takes a few tens of ms on CPU."""
    over = {
        "run_dir": str(run_dir),
        "model.preset": "tiny", "model.num_layers": 2, "model.hidden_size": 64, "model.ffn_hidden_size": 192,
        "model.vocab_size": VOCAB,
        "data.tokenizer": data.tokenizer, "data.blend": f"['{data.prefix}']", "data.seq_length": 64,
        "data.split": "90,10,0",
        "optimizer.lr": 3e-3, "optimizer.min_lr": 3e-4,
        "schedule.style": "wsd", "schedule.train_steps": steps, "schedule.warmup_steps": 2,
        "schedule.decay_fraction": 0.2,
        "training.micro_batch_size": 4, "training.global_batch_size": 8, "training.precision": "fp32",
        # pinned (the defaults): the learning bars were measured for these seeds' spread
        "training.seed": 1234, "data.seed": 1234,
        "training.eval_interval": 0, "training.eval_iters": 0,
        "logging.log_interval": 1, "logging.tensorboard": False, "logging.progress": "plain",
        "checkpoint.save_interval": 1000,
    }
    over.update(extra)
    return [f"{k}={v}" for k, v in over.items()]


def train_records(run_dir) -> dict:
    """step -> the logged training record (validation records left out), from metrics.jsonl."""
    from megatron_biglm.training.metrics import read_metrics

    return {r["step"]: r for r in read_metrics(Path(run_dir) / "metrics.jsonl") if r.get("kind", "train") == "train"}


def loss_and_grad_norm(run_dir) -> dict:
    """step -> (loss, grad norm): what exactness tests compare, bit for bit."""
    return {step: (r["loss"], r["grad_norm"]) for step, r in train_records(run_dir).items()}


def poisoned_train(config, overrides, poison, callbacks=()):
    """`train(config, overrides)` with every per-token loss passed through `poison(step, loss)`:
    fault injection through the public seams, a recipe (BiGLM pretraining, wrapped) that is
    also a callback (its `on_step` advances the step it poisons)."""
    from megatron_biglm.cli.train import train
    from megatron_biglm.training.pretrain_recipe import PretrainRecipe

    class Poisoned(PretrainRecipe):
        step = 1

        def forward(self, model, batch, device):
            output, loss_func = super().forward(model, batch, device)
            return poison(self.step, output), loss_func

        def on_step(self, step, state, ctx=None):  # noqa: ARG002 - the callback signature
            self.step = step + 1

    recipe = Poisoned()
    return train(config, overrides, callbacks=[recipe, *callbacks], recipe=recipe)
