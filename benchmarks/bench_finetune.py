"""Fine-tuning against the peers a user compares us with: the same model, data and
hyperparameters, 1 CPU thread, each side in its own process, run alternately.

  head         our fine-tuning entry (`kind: head`) vs transformers' `Trainer` with
               `EuroBertForSequenceClassification`: reviews (`text,label` csv), validation and a
               checkpoint every epoch on both sides
  contrastive  our entry (`kind: contrastive`) vs sentence-transformers' `SentenceTransformerTrainer`
               with `MultipleNegativesRankingLoss` (in-batch negatives, scale 1/temperature): the
               standard library's docstring pairs, nDCG@10 on the held-out BEIR folder at the end

The start point is one random EuroBERT of the `--shape`'s preset (`tiny`, or `136m`: BiGLM-136M's
layers and width on 160-word reviews cut at 128 tokens; the HF directory the peers load, and its
`from-hf` import that our entry starts from), the tokenizer our BPE on the sample corpus.
Like for like: the classifier pools the same way on both sides (mean over the valid tokens,
then dense, GELU, linear: `classifier_pooling="mean"` for `EuroBertForSequenceClassification`),
each side evaluates exactly once per epoch (the final score is the last epoch's evaluation,
not one more), `datasets` gets a fresh cache folder every run, and `--seed` seeds both sides.

Reported per side and repeat: wall time and CPU time of the whole fine-tune (data reading,
model building, checkpoints and validation included; the Python imports of either side are
not), optimizer steps and the final score; the repeats run interleaved (ours, theirs, then
theirs, ours, ...) and the ratio ours / theirs is given per repeat, as its median and range
(goal <= 1.1). With one torch thread a side's CPU time (its process and the child processes
it waited for) is its wall time on an idle machine, and it stays put when other jobs share the
cores (wall time does not). A per-phase breakdown, in CPU seconds, says where the time goes:
  setup       from the start to the first training step (tokenizer, data reading and
              tokenizing, model building, the start weights)
  data        fetching and collating each step's batch
  fwd/bwd     forward and backward passes
  optimizer   the optimizer step and the step's bookkeeping (scheduler, zeroing, loss reduction)
  evaluation  the task's evaluation (each epoch; at the end for contrastive)
  saving      checkpoints (and the best-checkpoint pointer)
  other       the rest of the wall time
Ours is timed by wrapping the loop's step functions, the validator and the checkpoint save in
this benchmark's child process; the peers by a `TrainerCallback` on their own events.

    python -m benchmarks finetune [--which head,contrastive] [--repeats 3] [--seed 1234]
    python -m benchmarks finetune --which head --shape 136m --repeats 2

Needs the `bench` extra (accelerate, which Trainer requires) and the `retrieval` extra.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SEED = 1234


def CLOCK() -> float:  # noqa: N802 - a clock, used like time.perf_counter
    """CPU seconds of this side so far: its process and the children it waited for (megatron's
    dist_checkpointing writes a checkpoint from worker processes)."""
    children = os.times()
    return time.process_time() + children.children_user + children.children_system


PHASES = ("setup", "data", "fwd/bwd", "optimizer", "evaluation", "saving", "other")
HEAD = dict(epochs=4, lr=1e-3, batch=16, max_length=64, warmup=0.06, weight_decay=0.01)
# the model preset and the head task's data per --shape: `tiny`, and the 136M model (BiGLM-136M's
# layers and width) on reviews long enough to fill 128 tokens, one epoch of 4 steps (CPU: ~30 s a step)
SHAPES = {"tiny": dict(preset="tiny", words=8, train=512, valid=128, head=dict(HEAD)),
          "136m": dict(preset="136m", words=160, train=64, valid=32, head=dict(HEAD, epochs=1, max_length=128))}
CONTRASTIVE = dict(epochs=2, lr=1e-3, batch=32, max_length=64, warmup=0.06, weight_decay=0.01, temperature=0.05)
GOOD = ["sweet", "noble", "gentle", "fair", "good"]
BAD = ["foul", "vile", "wicked", "base", "false"]


# ------------------------------------------------------------------ shared inputs (parent)
def reviews(path: Path, n: int, seed: int, words_per_row: int = 8) -> str:
    """`text,label` rows: `words_per_row` words of Shakespeare's, one of them a cue of the sentiment."""
    import csv

    from megatron_biglm.data import sample_corpus

    words = [w for w in " ".join(d["text"] for d in sample_corpus.iter_documents(1)).lower().split()
             if w.isalpha()][:5000]
    rng = random.Random(seed)
    with open(path, "w", newline="", encoding="utf-8") as f:
        out = csv.writer(f)
        out.writerow(["text", "label"])
        for i in range(n):
            text = [rng.choice(words) for _ in range(words_per_row - 1)]
            text.insert(rng.randrange(words_per_row), rng.choice(GOOD if i % 2 else BAD))
            out.writerow([" ".join(text), "pos" if i % 2 else "neg"])
    return str(path)


def prepare(folder: Path, shape: dict) -> dict:
    """The start model (HF directory and its megatron import), the tokenizer and the data."""
    import torch
    from transformers import EuroBertForMaskedLM

    from benchmarks.bench_eval import sample_tokenizer
    from megatron_biglm.export.convert_from_hf import from_hf
    from megatron_biglm.export.hf_config import hf_config_from_biglm
    from megatron_biglm.finetune.retrieval.stdlib_set import build_stdlib_set
    from megatron_biglm.model.presets import load_preset

    tokenizer, _ = sample_tokenizer(folder)
    torch.manual_seed(0)
    model = EuroBertForMaskedLM(hf_config_from_biglm(load_preset(shape["preset"]), tokenizer)).eval()
    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    from_hf(folder / "hf", folder / "ckpt", progress=False, verify=False)
    stdlib = build_stdlib_set(folder / "stdlib")
    return {"hf": str(folder / "hf"), "ckpt": str(folder / "ckpt"),
            "train": reviews(folder / "train.csv", shape["train"], 1, shape["words"]),
            "valid": reviews(folder / "valid.csv", shape["valid"], 2, shape["words"]), "head": shape["head"],
            "pairs": stdlib["train_file"], "beir": stdlib["beir_dir"], "folder": str(folder)}


# ------------------------------------------------------------------ the sides (subprocesses)
def warmup_steps(examples: int, h: dict) -> int:
    """The warmup our entry derives (run/plan.py), for the peers: round(fraction x steps)."""
    from megatron_biglm.finetune.epochs import train_steps

    return int(round(h["warmup"] * train_steps(examples, h["epochs"], h["batch"])))


class PhaseClock:
    """Exclusive time per phase: a phase that runs inside another (a batch fetched inside the
    forward/backward) is counted once, in the inner phase."""

    def __init__(self, start: float):
        self.start = start
        self.totals: dict = defaultdict(float)
        self.calls: dict = defaultdict(int)
        self._stack: list = []
        self.setup = None  # seconds from the start to the first training step

    def wrap(self, phase: str, fn, first_step: bool = False):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            now = CLOCK()
            if first_step and self.setup is None:
                self.setup = now - self.start - sum(self.totals.values())
            self._stack.append([now, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                began, inner = self._stack.pop()
                spent = CLOCK() - began
                self.totals[phase] += spent - inner
                self.calls[phase] += 1
                if self._stack:
                    self._stack[-1][1] += spent
        return timed

    def breakdown(self, wall: float) -> dict:
        out = {phase: self.totals.get(phase, 0.0) for phase in PHASES if phase not in ("setup", "other")}
        out["setup"] = self.setup or 0.0
        out["other"] = wall - sum(out.values())
        return out


class _TimedIterator:
    def __init__(self, iterator, clock: PhaseClock):
        self.next = clock.wrap("data", lambda: next(iterator))

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()


def instrument_ours(clock: PhaseClock) -> None:
    """Time our fine-tune's phases by wrapping, in this child process only, the module
    functions the loop looks up at call time (the backend is built when the run starts)."""
    from megatron_biglm.checkpoint import megatron_io
    from megatron_biglm.finetune.validation import TaskValidator
    from megatron_biglm.training import step

    forward_backward = step.forward_backward
    timed_train = clock.wrap("fwd/bwd", forward_backward)
    timed_eval = clock.wrap("evaluation", forward_backward)
    step.forward_backward = lambda *a, forward_only=False, **k: (timed_eval if forward_only else timed_train)(
        *a, forward_only=forward_only, **k)
    make_forward_step = step.make_forward_step

    def timed_forward_step(*args, **kwargs):
        forward_step = make_forward_step(*args, **kwargs)

        def fetch_timed(data_iterator, model):
            return forward_step(_TimedIterator(data_iterator, clock), model)
        return fetch_timed

    step.make_forward_step = timed_forward_step
    step.train_step = clock.wrap("optimizer", step.train_step, first_step=True)
    megatron_io.save_checkpoint = clock.wrap("saving", megatron_io.save_checkpoint)
    TaskValidator.validate = clock.wrap("evaluation", TaskValidator.validate)
    TaskValidator.on_save = clock.wrap("saving", TaskValidator.on_save)


def trainer_clock(start: float):
    """A `TrainerCallback` that splits a (Sentence)Trainer run into the same phases."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.totals = defaultdict(float)
            self.mark = None

        def _to(self, phase: str) -> None:
            now = CLOCK()
            self.totals[phase] += now - self.mark
            self.mark = now

        def on_train_begin(self, args, state, control, **kwargs):
            self.mark = CLOCK()
            self.totals["setup"] = self.mark - start

        def breakdown(self, wall: float, after: dict | None = None) -> dict:
            out = {phase: self.totals.get(phase, 0.0) for phase in PHASES if phase != "other"}
            for phase, seconds in (after or {}).items():
                out[phase] += seconds
            out["other"] = wall - sum(out.values())
            return out

    # each event ends the phase that ran up to it (the Trainer's order: fetch the batch, step
    # begin, forward/backward, pre-optimizer, optimizer, step end; at an epoch's end evaluate, save)
    for event, phase in (("on_step_begin", "data"), ("on_pre_optimizer_step", "fwd/bwd"),
                         ("on_step_end", "optimizer"), ("on_epoch_end", "other"),
                         ("on_evaluate", "evaluation"), ("on_save", "saving")):
        setattr(Clock, event, lambda self, args, state, control, _phase=phase, **kwargs: self._to(_phase))
    return Clock()


def ours(kind: str, inputs: dict, run: Path) -> dict:
    import megatron.core  # noqa: F401 - imports are not timed, on either side
    import yaml
    from transformers import AutoTokenizer  # noqa: F401 - the tokenizer library, imported before the clock as the peers do

    from megatron_biglm.config import load_config
    from megatron_biglm.run import finetune

    seed = inputs["seed"]

    h = inputs["head"] if kind == "head" else CONTRASTIVE
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
                     "seed": seed},
        "data": {"seed": seed},
        "checkpoint": {"keep_last": 1},
        "logging": {"log_interval": 10 ** 6, "tensorboard": False, "progress": "plain"}}
    (run.parent / f"{run.name}.yaml").write_text(yaml.safe_dump(config))
    start, cpu_start = time.perf_counter(), CLOCK()
    clock = PhaseClock(cpu_start)
    instrument_ours(clock)
    results = finetune(load_config(str(run.parent / f"{run.name}.yaml")))
    wall, cpu = time.perf_counter() - start, CLOCK() - cpu_start
    last = results["validations"][-1]["valid"]["validation"]
    score = last["accuracy"] if kind == "head" else last["ndcg@10"]
    return {"wall_s": wall, "cpu_s": cpu, "steps": results["train_steps"], "score": score,
            "phases": clock.breakdown(cpu),
            "evaluations": len(results["validations"])}


def hf_trainer(inputs: dict, run: Path) -> dict:
    """transformers' Trainer on the same start model, data and hyperparameters."""
    import numpy as np
    from datasets import load_dataset
    from transformers import (AutoTokenizer, DataCollatorWithPadding, EuroBertForSequenceClassification, Trainer,
                              TrainingArguments)

    h, seed = inputs["head"], inputs["seed"]
    start, cpu_start = time.perf_counter(), CLOCK()
    clock = trainer_clock(cpu_start)
    tok = AutoTokenizer.from_pretrained(inputs["hf"])
    data = load_dataset("csv", data_files={"train": inputs["train"], "validation": inputs["valid"]},
                        cache_dir=str(run / "datasets_cache"))  # fresh: nothing reused from an earlier run
    labels = sorted(set(data["train"]["label"]))
    data = data.map(lambda b: {**tok(b["text"], truncation=True, max_length=h["max_length"]),
                               "labels": [labels.index(x) for x in b["label"]]}, batched=True,
                    remove_columns=["text", "label"])
    # ours pools the classifier input as the mean over the valid tokens (its default): the same here
    model = EuroBertForSequenceClassification.from_pretrained(inputs["hf"], num_labels=len(labels),
                                                              classifier_pooling="mean")
    args = TrainingArguments(output_dir=str(run), per_device_train_batch_size=h["batch"],
                             per_device_eval_batch_size=16, num_train_epochs=h["epochs"], learning_rate=h["lr"],
                             warmup_steps=warmup_steps(len(data["train"]), h), weight_decay=h["weight_decay"],
                             lr_scheduler_type="linear", eval_strategy="epoch", save_strategy="epoch", save_total_limit=1, logging_strategy="no",
                             report_to=[], use_cpu=True, seed=seed, dataloader_num_workers=0, disable_tqdm=True)

    def accuracy(pred):
        return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    trainer = Trainer(model=model, args=args, train_dataset=data["train"], eval_dataset=data["validation"],
                      data_collator=DataCollatorWithPadding(tok), compute_metrics=accuracy, callbacks=[clock])
    out = trainer.train()
    wall, cpu = time.perf_counter() - start, CLOCK() - cpu_start
    evaluations = [r["eval_accuracy"] for r in trainer.state.log_history if "eval_accuracy" in r]
    return {"wall_s": wall, "cpu_s": cpu, "steps": out.global_step, "score": evaluations[-1],
            "phases": clock.breakdown(cpu),
            "evaluations": len(evaluations)}


def st_trainer(inputs: dict, run: Path) -> dict:
    """sentence-transformers' MultipleNegativesRankingLoss on the same start model and pairs."""
    from datasets import Dataset
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments, losses)

    from megatron_biglm.export.sentence_transformers_dir import build_st_directory
    from megatron_biglm.finetune.retrieval.beir import evaluate_beir
    from megatron_biglm.finetune.retrieval.encoders import SentenceTransformerEncoder
    from megatron_biglm.finetune.retrieval.pairs import read_pairs

    h, seed = CONTRASTIVE, inputs["seed"]
    start, cpu_start = time.perf_counter(), CLOCK()
    clock = trainer_clock(cpu_start)
    st_dir = build_st_directory(inputs["hf"], run / "start", max_seq_length=h["max_length"])
    model = SentenceTransformer(str(st_dir), device="cpu")
    pairs, _ = read_pairs(inputs["pairs"])
    data = Dataset.from_dict({"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]})
    args = SentenceTransformerTrainingArguments(
        output_dir=str(run / "out"), per_device_train_batch_size=h["batch"], num_train_epochs=h["epochs"],
        learning_rate=h["lr"], warmup_steps=warmup_steps(len(data), h), weight_decay=h["weight_decay"],
        lr_scheduler_type="linear",
        save_strategy="no", logging_strategy="no", report_to=[], use_cpu=True, seed=seed, disable_tqdm=True,
        prompts={"anchor": "query: ", "positive": "passage: "}, dataloader_num_workers=0)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                         loss=losses.MultipleNegativesRankingLoss(model, scale=1 / h["temperature"]),
                                         callbacks=[clock])
    out = trainer.train()
    t0 = CLOCK()
    model.save(str(run / "trained"))
    t1 = CLOCK()
    score = evaluate_beir(SentenceTransformerEncoder(run / "trained"), inputs["beir"], progress=False)["ndcg@10"]
    wall, t2 = time.perf_counter() - start, CLOCK()
    return {"wall_s": wall, "cpu_s": t2 - cpu_start, "steps": out.global_step, "score": score, "evaluations": 1,
            "phases": clock.breakdown(t2 - cpu_start, after={"saving": t1 - t0, "evaluation": t2 - t1})}


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


def _spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """median (min–max) of the repeats."""
    values = sorted(values)
    text = fmt.format(statistics.median(values))
    return text if len(values) == 1 else f"{text} ({fmt.format(values[0])}–{fmt.format(values[-1])})"


def report(which: str, sides: tuple, runs: dict) -> None:
    """One task's table and per-phase breakdown, from every repeat of both sides."""
    ours_side, their_side = sides
    pairs = list(zip(runs[ours_side], runs[their_side]))
    cpu_ratios = [a["cpu_s"] / b["cpu_s"] for a, b in pairs]
    wall_ratios = [a["wall_s"] / b["wall_s"] for a, b in pairs]
    print(f"\n{which}: median (min–max) over {len(pairs)} interleaved repeats; ratios ours/theirs per repeat")
    print("| side | CPU s | wall s | steps | CPU s/step | evaluations | score | ratio CPU | ratio wall |")
    print("|---|---|---|---|---|---|---|---|---|")
    for side in sides:
        rs = runs[side]
        ratios = (f"**{_spread(cpu_ratios)}×** | {_spread(wall_ratios)}×" if side == ours_side else " | ")
        print(f"| {side} | {_spread([r['cpu_s'] for r in rs], '{:.1f}')} | {_spread([r['wall_s'] for r in rs], '{:.1f}')} | "
              f"{rs[0]['steps']} | {_spread([r['cpu_s'] / r['steps'] for r in rs], '{:.3f}')} | {rs[0]['evaluations']} | "
              f"{_spread([r['score'] for r in rs], '{:.3f}')} | {ratios} |", flush=True)
    print(f"\n{which}: CPU seconds per phase, median over the repeats")
    print("| side | " + " | ".join(PHASES) + " |")
    print("|---|" + "---|" * len(PHASES))
    for side in sides:
        cells = [f"{statistics.median(r['phases'][p] for r in runs[side]):.2f}" for p in PHASES]
        print(f"| {side} | " + " | ".join(cells) + " |", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--side" in argv:
        return side_main(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--which", default="head,contrastive")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=SEED, help="the training seed of both sides")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                   help="the model and head data (136m: the head task only)")
    args = p.parse_args(argv)
    if args.shape != "tiny" and args.which != "head":
        p.error(f"--shape {args.shape} runs the head task only: add --which head")
    pairs = {"head": ("ours-head", "hf-head"), "contrastive": ("ours-contrastive", "st-contrastive")}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        inputs = {**prepare(folder, SHAPES[args.shape]), "seed": args.seed}
        inputs_file = folder / "inputs.json"
        inputs_file.write_text(json.dumps(inputs))
        print(f"CPU, 1 torch thread per side; {args.repeats} interleaved runs per side; seed {args.seed}; "
              f"{args.shape} EuroBERT (random), head: {inputs['head']}, {SHAPES[args.shape]['words']} words a row; "
              f"contrastive: {CONTRASTIVE}")
        for which in args.which.split(","):
            runs: dict = {side: [] for side in pairs[which]}
            for r in range(args.repeats):
                order = pairs[which] if r % 2 == 0 else pairs[which][::-1]  # neither side always goes first
                for side in order:
                    runs[side].append(run_side(side, inputs_file, folder / f"{side}-{r}"))
            report(which, pairs[which], runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
