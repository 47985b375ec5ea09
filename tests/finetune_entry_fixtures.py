"""A synthetic prompted-classification task for the fine-tuning entry point: "does the
sequence contain `cat`?" in the RTE schema (premise: 6 random words, hypothesis: "cat",
label 0 = entailment = yes). Learnable by a tiny model in a few hundred steps on CPU;
chance is 50 % (balanced), so accuracy well above it (the tests' bars: chance + 1/3 of the
gain measured over seeds) means the label was read off the mask slot."""
from __future__ import annotations

import json
import random
from pathlib import Path

from finetune_fixtures import word_tokenizer

WORDS = ["red", "blue", "green", "dog", "fish", "bird", "tree", "sun", "moon", "rock", "sand", "snow"]
TEMPLATE = "{premise} . {hypothesis} ? <mask>"


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(6)]
        label = i % 2
        if label == 0:
            words[rng.randrange(6)] = "cat"
        out.append({"premise": " ".join(words), "hypothesis": "cat", "label": label, "idx": i})
    rng.shuffle(out)
    return out


def write_task(folder: Path, n_train: int = 192, n_valid: int = 64, n_test: int = 64) -> dict:
    """jsonl splits and a word-level tokenizer under `folder`; the config keys that use them."""
    return write_splits(folder, rows, (n_train, n_valid, n_test), WORDS + ["cat", ".", "?", "yes", "no"])


def write_splits(folder: Path, make_rows, sizes: tuple[int, int, int], words: list[str]) -> dict:
    """train / validation / test jsonl files of `make_rows(n, seed)` (the `sizes`, seeds 1, 2, 3)
    and a word-level tokenizer of `words` under `folder`; the config keys that use them."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n, seed in zip(("train", "validation", "test"), sizes, (1, 2, 3)):
        path = folder / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in make_rows(n, seed)))
        files[split] = str(path)
    tok = word_tokenizer([" ".join(words)])
    tok.save_pretrained(str(folder / "tokenizer"))
    return {"tokenizer": str(folder / "tokenizer"), "files": files}


def tiny_run(task: dict, run_dir: Path, *, lr: float, batch: int, log_interval: int) -> dict:
    """The run, model (2 layers, 64 wide), optimizer, batch and logging overrides of a tiny
    CPU fine-tune on `task`'s tokenizer."""
    return {
        "run_dir": str(run_dir),
        "model.preset": "tiny", "model.num_layers": 2, "model.hidden_size": 64, "model.ffn_hidden_size": 192,
        "model.vocab_size": 64, "data.tokenizer": task["tokenizer"],
        "optimizer.lr": lr, "optimizer.min_lr": 0.0,
        "training.micro_batch_size": batch, "training.global_batch_size": batch, "training.precision": "fp32",
        "training.seed": 1234,  # pinned (the default): the tests' learning bars were measured per seed
        "logging.log_interval": log_interval, "logging.tensorboard": False, "logging.progress": "plain",
    }


def finetune_overrides(task: dict, run_dir: Path, **extra) -> list[str]:
    """A 2-layer, 64-wide model, prompts of 16 tokens, 4 epochs of 12 steps; the prompt (the
    verbalizer's options) unless `extra` names another task."""
    over = {
        **tiny_run(task, run_dir, lr=3e-3, batch=16, log_interval=4),
        "finetune.task": "rte", "finetune.options.template": f"'{TEMPLATE}'",
        "finetune.options.label_words": "['yes', 'no']",
        "finetune.max_length": 16, "finetune.epochs": 4, "finetune.warmup_fraction": 0.1,
        "finetune.schedule": "linear", "finetune.test_split": "test", "finetune.eval_batch_size": 32,
        **{f"finetune.data.{k}": v for k, v in (("train", task["files"]["train"]),
                                                  ("validation", task["files"]["validation"]),
                                                  ("test", task["files"]["test"]))},
    }
    over.update(extra)
    if over["finetune.task"] != "rte":
        over = {k: v for k, v in over.items() if not k.startswith("finetune.options.") or k in extra}
    return [f"{k}={v}" for k, v in over.items()]
