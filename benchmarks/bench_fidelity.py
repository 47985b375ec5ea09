"""The paper's Table 1 in miniature: BiGLM against "w/o attn" and "w/o both", with error bars.

    python -m benchmarks fidelity [--steps 1000] [--seeds 1 2 3] [--out runs/fidelity]
                                  [--questions 150] [--windows 64] [--prompts 24]

Three objective variants (`objective.variant`: biglm, no_attn, mlm at 15 %) are trained with
equal compute from the quickstart's setup: the tiny preset (1.05M parameters) on the sample
corpus (42 plays, byte-level BPE of 2,048), `tiny_cpu.yaml`'s schedule scaled to `--steps`,
same tokens, steps, shape, schedule and data order within a seed (`training.seed` and
`data.seed` are the seed). Each checkpoint is exported to HF and evaluated, as it was trained
(biglm with split attention, the others with full attention), on the validation documents that
no variant trained on:

  suffix NLL @ beta   windows of 128 tokens cut at 64; a fraction beta of the suffix masked
                      (0.15, 0.5, 1.0: 1.0 is pure generation), the prefix visible; nats per
                      masked token. The masked positions are the same for every model.
  MLM NLL @ 15 %      15 % of each window masked uniformly, full attention (the NLU proxy).
  next-line acc_mi    the quickstart's zero-shot next-line task through lm-eval
                      (acc_mutual_info, `--questions` questions, chance 0.25).
  gen NLL (w/o both)  Mask-Predict continuations of 32 tokens (T = 10, greedy) after 64-token
                      prompts, scored by the same seed's "w/o both" model with full context
                      (`text_metrics.full_context_nll`); and their distinct-2.

The table gives each metric's mean ± the 95 % confidence half-width over seeds (Student t);
`RESULTS_NAME` and `PLOT_NAME` are written under `--out`, with every number's checkpoint.
Sized for about 40 minutes on 2 cores at the defaults (see benchmarks/RESULTS.md).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.text_metrics import distinct_2, full_context_nll

VARIANTS = ("biglm", "no_attn", "mlm")
LABELS = {"biglm": "BiGLM", "no_attn": "w/o attn", "mlm": "w/o both"}
BETAS = (0.15, 0.5, 1.0)
WINDOW, CUT, PROMPT, CONTINUATION, GEN_STEPS = 128, 64, 64, 32, 10
METRICS = (*(f"suffix_nll_{b}" for b in BETAS), "mlm_nll_0.15", "next_line_acc_mi", "gen_nll_by_mlm",
           "gen_distinct_2")
LOWER_IS_BETTER = {m: not m.startswith(("next_line", "gen_distinct")) for m in METRICS}
RESULTS_NAME, PLOT_NAME = "fidelity.json", "fidelity.png"
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def ci95(values: list[float]) -> tuple[float, float]:
    """(mean, 95 % half-width by Student's t; nan for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, _T975.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


# ------------------------------------------------------------------ setup and training
def prepare(out: Path, max_plays: int | None, vocab_size: int) -> dict:
    """The quickstart's corpus, tokenizer and indexed data, and its validation documents."""
    from megatron_biglm.cli import quickstart

    corpus = quickstart.stage_corpus(out, max_plays)
    tok_dir = quickstart.stage_tokenizer(out, corpus, vocab_size)
    quickstart.stage_preprocess(out, corpus, tok_dir, workers=1)
    return dict(corpus=corpus, tok_dir=tok_dir, data_prefix=out / "data" / "shakespeare_text_document",
                held_out=quickstart.held_out_documents(corpus))


def train_variant(setup: dict, out: Path, variant: str, seed: int, steps: int, vocab_size: int) -> dict:
    from megatron_biglm.cli import quickstart
    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.cli.train import train

    run_dir = out / "runs" / f"{variant}_seed{seed}"
    overrides = [f"data.tokenizer={setup['tok_dir']}", f"data.blend=['{setup['data_prefix']}']",
                 f"run_dir={run_dir}", f"model.vocab_size={vocab_size}", f"objective.variant={variant}",
                 f"schedule.train_steps={steps}", f"schedule.warmup_steps={max(1, steps // 20)}",
                 f"training.seed={seed}", f"data.seed={seed}", f"checkpoint.save_interval={steps}",
                 f"training.eval_interval={steps}", "training.eval_iters=8", "logging.tensorboard=false"]
    t0 = time.perf_counter()
    result = train(quickstart.TINY_CPU_CONFIG, overrides)
    if result.iteration != steps:
        raise RuntimeError(f"{variant} seed {seed} stopped at step {result.iteration} of {steps} "
                           f"({result.stopped_by}); rerun to finish")
    hf_dir = run_dir / "hf"
    to_hf(result.checkpoint, hf_dir, progress=False)
    return dict(variant=variant, seed=seed, checkpoint=str(result.checkpoint), hf_dir=str(hf_dir),
                val_loss=result.last_val_loss, train_seconds=time.perf_counter() - t0)


# ------------------------------------------------------------------ evaluation
def load(hf_dir: str, variant: str):
    """(adapter, tokenizer) of an export, run as its variant was trained."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from megatron_biglm.inference import inference_token_ids
    from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter

    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    model = AutoModelForMaskedLM.from_pretrained(hf_dir).eval()
    split = "on" if variant == "biglm" else "off"
    return HFMaskedLMAdapter(model, inference_token_ids(tokenizer), split_attention=split), tokenizer


def held_out_windows(tokenizer, documents: list[str], count: int) -> list[list[int]]:
    """Up to `count` windows of WINDOW ids, cut from the validation documents in order."""
    windows = []
    for doc in documents:
        ids = tokenizer(doc, add_special_tokens=False)["input_ids"]
        windows += [ids[s:s + WINDOW] for s in range(0, len(ids) - WINDOW + 1, WINDOW)]
        if len(windows) >= count:
            return windows[:count]
    if not windows:
        raise ValueError(f"no validation document holds {WINDOW} tokens")
    return windows


def masked_nll(adapter, windows: list[list[int]], split: int, n_masked: int, seed: int) -> float:
    """Nats per masked token: `n_masked` positions of each window's [split, WINDOW) masked
    (the same positions for every model: drawn from `seed`), attention split at `split`."""
    rng = random.Random(seed)
    dev, mask = adapter.device, int(adapter.special.mask_id)
    total = 0.0
    for start in range(0, len(windows), 16):
        rows = torch.tensor(windows[start:start + 16], device=dev)
        picked = torch.tensor([sorted(rng.sample(range(split, WINDOW), n_masked)) for _ in rows], device=dev)
        ids = rows.scatter(1, picked, mask)
        lengths = torch.full((len(rows),), WINDOW, device=dev)
        split_t = None if split == 0 else torch.full((len(rows),), split, device=dev)
        logp = adapter.logits(ids, lengths, split_t, picked).float().log_softmax(-1)
        total -= float(logp.gather(-1, rows.gather(1, picked)[..., None]).sum())
    return total / (len(windows) * n_masked)


def next_line_accuracy(hf_dir: str, variant: str, task_dir: Path) -> float:
    import lm_eval

    from megatron_biglm.evaluation import register_lm_eval_models
    from megatron_biglm.evaluation.next_line_task import write_next_line_task_yaml
    from megatron_biglm.evaluation.tasks import local_task_manager

    register_lm_eval_models()
    split = "on" if variant == "biglm" else "off"
    with tempfile.TemporaryDirectory(prefix="biglm-fidelity-") as tmp:
        write_next_line_task_yaml(task_dir, Path(tmp))
        results = lm_eval.simple_evaluate(model="biglm", model_args=f"path={hf_dir},scoring=beam,split_attention={split}",
                                          tasks=["arc_easy"], task_manager=local_task_manager(tmp))
    return float(results["results"]["arc_easy"]["acc_mutual_info,none"])


def continuations(adapter, tokenizer, windows: list[list[int]], count: int) -> tuple[list, list]:
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator

    prompts = [w[:PROMPT] for w in windows[:count]]
    outs = MaskPredictGenerator(adapter, tokenizer).generate_ids(
        prompts, GenerationConfig(length=CONTINUATION, steps=GEN_STEPS), batch_size=8)
    return prompts, [list(o.ids) for o in outs]


def evaluate(rows: list[dict], setup: dict, out: Path, args) -> None:
    """Fill each row's metrics from its own export; generations are judged by the same seed's
    w/o-both model."""
    from megatron_biglm.evaluation.next_line_task import write_next_line_task

    task_dir = out / "next_line"
    write_next_line_task(setup["held_out"], task_dir, n_questions=args.questions, seed=0)
    judges = {}
    for row in rows:
        adapter, tokenizer = load(row["hf_dir"], row["variant"])
        windows = held_out_windows(tokenizer, setup["held_out"], args.windows)
        m = row.setdefault("metrics", {})
        with torch.no_grad():
            for beta in BETAS:
                m[f"suffix_nll_{beta}"] = masked_nll(adapter, windows, CUT, max(1, round(beta * (WINDOW - CUT))), 1)
            m["mlm_nll_0.15"] = masked_nll(adapter, windows, 0, round(0.15 * WINDOW), 2)
        m["next_line_acc_mi"] = next_line_accuracy(row["hf_dir"], row["variant"], task_dir)
        row["generated"] = continuations(adapter, tokenizer, windows, args.prompts)
        m["gen_distinct_2"] = distinct_2(row["generated"][1])
        row["windows"] = len(windows)
        print(f"[fidelity] {row['variant']} seed {row['seed']}: "
              + ", ".join(f"{k} {v:.4f}" for k, v in m.items()), flush=True)
    for row in rows:
        if row["seed"] not in judges:
            judge = next((r for r in rows if r["variant"] == "mlm" and r["seed"] == row["seed"]), None)
            judges[row["seed"]] = None if judge is None else load(judge["hf_dir"], "mlm")[0]
        judge = judges[row["seed"]]
        if judge is not None:
            prompts, outputs = row["generated"]
            row["metrics"]["gen_nll_by_mlm"] = full_context_nll(judge, prompts, outputs)
        row["generated"] = row["generated"][1][:2]  # two samples kept in the JSON


# ------------------------------------------------------------------ report
def summarize(rows: list[dict]) -> dict:
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    table = {}
    for metric in METRICS:
        table[metric] = {}
        for v in variants:
            values = [r["metrics"][metric] for r in rows if r["variant"] == v and metric in r["metrics"]]
            if values:
                mean, half = ci95(values)
                table[metric][v] = dict(mean=mean, ci95=half, n=len(values))
    return table


def markdown(results: dict) -> str:
    table, variants = results["table"], results["meta"]["variants"]
    lines = ["| metric | " + " | ".join(LABELS[v] for v in variants) + " | better |",
             "|---|" + "---:|" * len(variants) + "---|"]
    for metric, cells in table.items():
        shown = []
        for v in variants:
            c = cells.get(v)
            shown.append("-" if c is None else f"{c['mean']:.3f} ± {c['ci95']:.3f}")
        lines.append(f"| {metric} | " + " | ".join(shown) + f" | {'lower' if LOWER_IS_BETTER[metric] else 'higher'} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table, variants = results["table"], results["meta"]["variants"]
    fig, axes = plt.subplots(2, 4, figsize=(14, 6))
    for ax, metric in zip(axes.flat, METRICS):
        cells = [table[metric].get(v) for v in variants]
        means = [c["mean"] if c else float("nan") for c in cells]
        errs = [0.0 if (not c or math.isnan(c["ci95"])) else c["ci95"] for c in cells]
        ax.bar([LABELS[v] for v in variants], means, yerr=errs, capsize=4, color=["C0", "C1", "C2"][:len(variants)])
        ax.set_title(f"{metric} ({'lower' if LOWER_IS_BETTER[metric] else 'higher'} is better)", fontsize=9)
        finite = [m for m in means if not math.isnan(m)]
        if finite:
            lo, hi = min(finite), max(finite)
            pad = (hi - lo) * 0.6 + max(errs) + 1e-3
            ax.set_ylim(lo - pad, hi + pad)
    for ax in list(axes.flat)[len(METRICS):]:
        ax.axis("off")
    fig.suptitle(f"tiny BiGLM ablation, {results['meta']['steps']} steps, seeds {results['meta']['seeds']} "
                 "(mean ± 95 % CI)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/fidelity"))
    p.add_argument("--steps", type=int, default=1000, help="training steps per model")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--max-plays", type=int, default=None, help="limit the corpus (default: all 42)")
    p.add_argument("--questions", type=int, default=150, help="next-line questions per model")
    p.add_argument("--windows", type=int, default=64, help="held-out windows for the NLL metrics")
    p.add_argument("--prompts", type=int, default=24, help="prompts for the continuations")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    setup = prepare(args.out, args.max_plays, args.vocab_size)
    rows = [train_variant(setup, args.out, v, s, args.steps, args.vocab_size)
            for s in args.seeds for v in args.variants]  # seed-major: a partial run has whole seeds
    evaluate(rows, setup, args.out, args)
    results = dict(meta=dict(variants=list(args.variants), seeds=list(args.seeds), steps=args.steps,
                             preset="tiny", corpus=str(setup["corpus"]), window=WINDOW, cut=CUT, questions=args.questions,
                             windows=args.windows, prompts=args.prompts, threads=torch.get_num_threads(),
                             torch=torch.__version__, seconds=time.perf_counter() - t0),
                   rows=rows, table=summarize(rows))
    (args.out / RESULTS_NAME).write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out / PLOT_NAME)
    print(markdown(results))
    print(f"wrote {args.out / RESULTS_NAME} and {args.out / PLOT_NAME} in {results['meta']['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
