"""Fine-tuning against the peers a user compares us with: the same model, data and
hyperparameters, 1 CPU thread, each side in its own process, run alternately.

  head         our fine-tuning entry (`kind: head`) vs transformers' `Trainer` with
               `EuroBertForSequenceClassification`: reviews (`text,label` csv), validation and a
               checkpoint every epoch on both sides
  contrastive  our entry (`kind: contrastive`) vs sentence-transformers' `SentenceTransformerTrainer`
               with `MultipleNegativesRankingLoss` (in-batch negatives, scale 1/temperature): the
               standard library's docstring pairs, nDCG@10 on the held-out BEIR folder at the end

The start point is one random `tiny` EuroBERT (the HF directory the peers load, and its
`from-hf` import that our entry starts from), the tokenizer our BPE on the sample corpus.
Reported per side: wall time of the whole fine-tune (data reading, model building, checkpoints
and validation included; the Python imports of either side are not),
optimizer steps, seconds per step and the final score; the ratio ours / theirs (goal <= 1.1).

    python -m benchmarks finetune [--which head,contrastive] [--repeats 2]

Needs the `bench` extra (accelerate, which Trainer requires) and the `retrieval` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = 1234
HEAD = dict(epochs=4, lr=1e-3, batch=16, max_length=64, warmup=0.06, weight_decay=0.01)
CONTRASTIVE = dict(epochs=2, lr=1e-3, batch=32, max_length=64, warmup=0.06, weight_decay=0.01, temperature=0.05)
GOOD = ["sweet", "noble", "gentle", "fair", "good"]
BAD = ["foul", "vile", "wicked", "base", "false"]


# ------------------------------------------------------------------ shared inputs (parent)
def reviews(path: Path, n: int, seed: int) -> str:
    """`text,label` rows: eight words of Shakespeare's, one of them a cue of the sentiment."""
    import csv

    from megatron_biglm.data import sample_corpus

    words = [w for w in " ".join(d["text"] for d in sample_corpus.iter_documents(1)).lower().split()
             if w.isalpha()][:5000]
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["text", "label"])
        for i in range(n):
            text = [rng.choice(words) for _ in range(7)]
            text.insert(rng.randrange(8), rng.choice(GOOD if i % 2 else BAD))
            out.writerow([" ".join(text), "pos" if i % 2 else "neg"])
    return str(path)


def prepare(folder: Path) -> dict:
    """The start model (HF directory and its megatron import), the tokenizer and the data."""
    from benchmarks.bench_eval import build_model, sample_tokenizer
    from megatron_biglm.export.convert_from_hf import from_hf
    from megatron_biglm.finetune.retrieval.stdlib_set import build_stdlib_set

    tokenizer, _ = sample_tokenizer(folder)
    model = build_model(tokenizer, "cpu")
    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    from_hf(folder / "hf", folder / "ckpt", progress=False, verify=False)
    stdlib = build_stdlib_set(folder / "stdlib")
    return {"hf": str(folder / "hf"), "ckpt": str(folder / "ckpt"),
            "train": reviews(folder / "train.csv", 512, 1), "valid": reviews(folder / "valid.csv", 128, 2),
            "pairs": stdlib["train_file"], "beir": stdlib["beir_dir"], "folder": str(folder)}


# ------------------------------------------------------------------ the sides (subprocesses)
def warmup_steps(examples: int, h: dict) -> int:
    """The warmup our entry derives (finetune/plan.py), for the peers: round(fraction x steps)."""
    from megatron_biglm.finetune.epochs import train_steps

    return int(round(h["warmup"] * train_steps(examples, h["epochs"], h["batch"])))


def ours(kind: str, inputs: dict, run: Path) -> dict:
    import megatron.core  # noqa: F401 - imports are not timed, on either side
    import yaml

    import megatron_biglm.cli.train  # noqa: F401
    import megatron_biglm.finetune.plan  # noqa: F401
    from megatron_biglm.cli.finetune import finetune

    h = HEAD if kind == "head" else CONTRASTIVE
    if kind == "head":
        task = {"kind": "head", "fields": ["text"], "label_field": "label"}
        data = {"train": inputs["train"], "validation": inputs["valid"]}
        extra = {}
    else:
        task = {"kind": "contrastive"}
        data = {"train": inputs["pairs"], "validation": inputs["beir"]}
        extra = {"validate_every_steps": 10 ** 9, "options": {"temperature": h["temperature"]}}

    config = {"run_dir": str(run), "finetune": {
        "task": task, "init_from": inputs["ckpt"], "data": data, "max_length": h["max_length"],
        "epochs": h["epochs"], "warmup_fraction": h["warmup"], "schedule": "linear", **extra},
        # the peers' AdamW: betas (0.9, 0.999), eps 1e-8, gradient clipping at 1.0
        "optimizer": {"lr": h["lr"], "min_lr": 0.0, "weight_decay": h["weight_decay"], "adam_beta2": 0.999},
        "training": {"micro_batch_size": h["batch"], "global_batch_size": h["batch"], "precision": "fp32",
                     "seed": SEED},
        "data": {"seed": SEED},
        "checkpoint": {"keep_last": 1},
        "logging": {"log_interval": 10 ** 6, "tensorboard": False, "progress": "plain"}}
    (run.parent / f"{run.name}.yaml").write_text(yaml.safe_dump(config))
    start = time.perf_counter()
    results = finetune(str(run.parent / f"{run.name}.yaml"))
    wall = time.perf_counter() - start
    last = results["validations"][-1]["valid"]["validation"]
    score = last["accuracy"] if kind == "head" else last["ndcg@10"]
    return {"wall_s": wall, "steps": results["train_steps"], "score": score}


def hf_trainer(inputs: dict, run: Path) -> dict:
    """transformers' Trainer on the same start model, data and hyperparameters."""
    import numpy as np
    from datasets import load_dataset
    from transformers import (AutoTokenizer, DataCollatorWithPadding, EuroBertForSequenceClassification, Trainer,
                              TrainingArguments)

    h = HEAD
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(inputs["hf"])
    data = load_dataset("csv", data_files={"train": inputs["train"], "validation": inputs["valid"]})
    labels = sorted(set(data["train"]["label"]))
    data = data.map(lambda b: {**tok(b["text"], truncation=True, max_length=h["max_length"]),
                               "labels": [labels.index(x) for x in b["label"]]}, batched=True,
                    remove_columns=["text", "label"])
    model = EuroBertForSequenceClassification.from_pretrained(inputs["hf"], num_labels=len(labels))
    args = TrainingArguments(output_dir=str(run), per_device_train_batch_size=h["batch"],
                             per_device_eval_batch_size=16, num_train_epochs=h["epochs"], learning_rate=h["lr"],
                             warmup_steps=warmup_steps(len(data["train"]), h), weight_decay=h["weight_decay"],
                             lr_scheduler_type="linear", eval_strategy="epoch", save_strategy="epoch", save_total_limit=1, logging_strategy="no",
                             report_to=[], use_cpu=True, seed=SEED, dataloader_num_workers=0, disable_tqdm=True)

    def accuracy(pred):
        return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    trainer = Trainer(model=model, args=args, train_dataset=data["train"], eval_dataset=data["validation"],
                      data_collator=DataCollatorWithPadding(tok), compute_metrics=accuracy)
    out = trainer.train()
    score = trainer.evaluate()["eval_accuracy"]
    return {"wall_s": time.perf_counter() - start, "steps": out.global_step, "score": score}


def st_trainer(inputs: dict, run: Path) -> dict:
    """sentence-transformers' MultipleNegativesRankingLoss on the same start model and pairs."""
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments, losses)

    from megatron_biglm.export.sentence_transformers_dir import build_st_directory
    from megatron_biglm.finetune.retrieval.beir import evaluate_beir
    from megatron_biglm.finetune.retrieval.encoders import SentenceTransformerEncoder
    from megatron_biglm.finetune.retrieval.pairs import read_pairs

    h = CONTRASTIVE
    start = time.perf_counter()
    st_dir = build_st_directory(inputs["hf"], run / "start", max_seq_length=h["max_length"])
    model = SentenceTransformer(str(st_dir), device="cpu")
    pairs, _ = read_pairs(inputs["pairs"])
    data = Dataset.from_dict({"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(run / "out"), per_device_train_batch_size=h["batch"], num_train_epochs=h["epochs"],
        learning_rate=h["lr"], warmup_steps=warmup_steps(len(data), h), weight_decay=h["weight_decay"],
        lr_scheduler_type="linear",
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True, seed=SEED, disable_tqdm=True,
        prompts={"anchor": "query: ", "positive": "passage: "}, dataloader_num_workers=0)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                         loss=losses.MultipleNegativesRankingLoss(model, scale=1 / h["temperature"]))
    out = trainer.train()
    model.save(str(run / "trained"))
    score = evaluate_beir(SentenceTransformerEncoder(run / "trained"), inputs["beir"], progress=False)["ndcg@10"]
    return {"wall_s": time.perf_counter() - start, "steps": out.global_step, "score": score}


def side_main(argv: list[str]) -> int:
    """One side in this (child) process: `--side NAME --inputs JSON --run DIR`."""
    p = argparse.ArgumentParser()
    p.add_argument("--side", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--run", required=True)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    inputs = json.loads(Path(args.inputs).read_text())
    run = Path(args.run)
    result = {"ours-head": lambda: ours("head", inputs, run), "hf-head": lambda: hf_trainer(inputs, run),
              "ours-contrastive": lambda: ours("contrastive", inputs, run),
              "st-contrastive": lambda: st_trainer(inputs, run)}[args.side]()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def run_side(side: str, inputs_file: Path, run: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, "-m", "benchmarks", "finetune", "--side", side, "--inputs",
                           str(inputs_file), "--run", str(run)], capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{side} failed:\n{done.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--side" in argv:
        return side_main(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--which", default="head,contrastive")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    pairs = {"head": ("ours-head", "hf-head"), "contrastive": ("ours-contrastive", "st-contrastive")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = prepare(folder)
        inputs_file = folder / "inputs.json"
        inputs_file.write_text(json.dumps(inputs))
        print(f"CPU, 1 torch thread per side; {args.repeats} alternating runs per side; tiny EuroBERT (random), "
              f"head: {HEAD}; contrastive: {CONTRASTIVE}")
        print("| task | side | wall s (best) | steps | s/step | score | ratio ours/theirs (wall, per step) |")
        print("|---|---|---|---|---|---|---|")
        for which in args.which.split(","):
            best: dict = {}
            for r in range(args.repeats):
                for side in pairs[which]:
                    result = run_side(side, inputs_file, folder / f"{side}-{r}")
                    if side not in best or result["wall_s"] < best[side]["wall_s"]:
                        best[side] = result
            a, b = (best[s] for s in pairs[which])
            for side in pairs[which]:
                x = best[side]
                ratio = "" if side != pairs[which][0] else \
                    f"{a['wall_s'] / b['wall_s']:.2f}x, {(a['wall_s'] / a['steps']) / (b['wall_s'] / b['steps']):.2f}x"
                print(f"| {which} | {side} | {x['wall_s']:.1f} | {x['steps']} | {x['wall_s'] / x['steps']:.3f} | "
                      f"{x['score']:.4f} | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
