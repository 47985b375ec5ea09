"""Zero-shot scoring throughput: requests/s per scoring rule, prefix reuse off vs on, for both
backends the one inference loader serves: the HF export and the megatron checkpoint.

The model is the `tiny` preset with random weights (speed does not depend on them), in its HF
export layout (EuroBERT, `hf`) and as the megatron checkpoint `from_hf` writes of that same
export (`megatron`: BiGLMModel in-process, native split, the `kv_cache` hook); the tokenizer is
our BPE trained on the sample corpus. Requests look
like a multiple-choice task: each question is a Shakespeare passage of `--context-tokens`
tokens with `--choices` continuations of `--choice-tokens` tokens; they go through the lm-eval
model's `loglikelihood`, so tokenization, batching and scoring are all timed. The speed-up is
prefix reuse on / off, measured in the same run on the same requests (and the scores of both
paths are checked to agree, and the two backends' scores against each other).

    python -m benchmarks eval [--backends hf,megatron] [--context-tokens 256] [--questions 12]
"""
from __future__ import annotations

import argparse
import json
import sys
import statistics
import tempfile
import time
from pathlib import Path


def build_model(tokenizer, device: str, preset: str = "tiny", dtype=None):
    import torch
    from transformers import EuroBertForMaskedLM

    from megatron_biglm.export.hf_config import hf_config_from_biglm
    from megatron_biglm.model.presets import load_preset

    torch.manual_seed(0)
    config = hf_config_from_biglm(load_preset(preset), tokenizer)
    return EuroBertForMaskedLM(config).to(device, dtype).eval()


def sample_tokenizer(folder: Path, max_plays: int = 3):
    """(our BPE trained on the sample corpus at the `tiny` preset's vocabulary size, the corpus
    jsonl it was trained on), both written under `folder`."""
    from transformers import AutoTokenizer

    from megatron_biglm.data import sample_corpus
    from megatron_biglm.data.tokenizer import train_bpe_tokenizer
    from megatron_biglm.model.presets import load_preset

    corpus = Path(folder) / "corpus.jsonl"
    sample_corpus.write_jsonl(corpus, max_plays=max_plays)
    train_bpe_tokenizer([str(corpus)], load_preset("tiny").vocab_size, Path(folder) / "tok")
    return AutoTokenizer.from_pretrained(str(Path(folder) / "tok")), corpus


def build_requests(tokenizer, corpus_jsonl: Path, questions: int, context_tokens: int,
                   choices: int, choice_tokens: int):
    """(context, continuation) pairs cut from real text: token spans decoded back to strings."""
    ids: list[int] = []
    with open(corpus_jsonl, encoding="utf-8") as f:
        for line in f:
            ids += tokenizer(json.loads(line)["text"], add_special_tokens=False)["input_ids"]
            if len(ids) > questions * (context_tokens + choices * choice_tokens):
                break
    pairs, cursor = [], 0
    for _ in range(questions):
        context = tokenizer.decode(ids[cursor:cursor + context_tokens])
        cursor += context_tokens
        for _ in range(choices):
            pairs.append((context, tokenizer.decode(ids[cursor:cursor + choice_tokens])))
            cursor += choice_tokens
    return pairs


def eval_lms(backend: str, source, tokenizer, scoring: str, batch_size: int, device: str,
             cache_layout: str = "grow"):
    """{reuse: lm-eval model} for one backend: the HF model object, or the megatron checkpoint
    through `biglm` (the one loader; reuse off = no prefix cache at all; `cache_layout` the
    megatron cache's layout, grow or pool)."""
    from megatron_biglm.evaluation.models import BiGLMEvalLM, HFMaskedLMEvalLM

    if backend == "hf":
        return {reuse: HFMaskedLMEvalLM(pretrained=source, tokenizer=tokenizer, scoring=scoring,
                                        batch_size=batch_size, prefix_reuse="on" if reuse else "off",
                                        progress=False) for reuse in (False, True)}
    return {reuse: BiGLMEvalLM(path=str(source), scoring=scoring, batch_size=batch_size,
                               prefix_cache="on" if reuse else "off", verify=False, device=device,
                               progress=False, cache_layout=cache_layout if reuse else "grow")
            for reuse in (False, True)}


def time_rule(lms: dict, pairs, repeats: int):
    """Median seconds over `repeats` for reuse off and on, measured alternately (off, on, off, ...)
    so that load changes on a shared machine hit both alike; plus scores and passes/request."""
    from lm_eval.api.instance import Instance

    reqs = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    times = {False: [], True: []}
    scores = {}
    for lm in lms.values():
        lm.loglikelihood(reqs[: max(1, len(reqs) // 8)])  # warm-up (allocator, kernels)
    for _ in range(repeats):
        for reuse, lm in lms.items():
            start = time.perf_counter()
            scores[reuse] = [s[0] for s in lm.loglikelihood(reqs)]
            _sync()
            times[reuse].append(time.perf_counter() - start)
    info = lms[False].get_model_info()["masked_lm_eval"]
    median = {reuse: statistics.median(t) for reuse, t in times.items()}
    return median, scores, info["forward_passes"] / info["scored_requests"]


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def megatron_checkpoint(model, tokenizer, folder: Path) -> Path:
    """The megatron checkpoint of `model`'s HF export (weights-only, TP=1), under `folder`."""
    from megatron_biglm.export.convert_from_hf import from_hf

    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    from_hf(folder / "hf", folder / "ckpt", progress=False, verify=False)
    return folder / "ckpt"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", type=int, default=12)
    p.add_argument("--choices", type=int, default=4)
    p.add_argument("--context-tokens", type=int, default=256)
    p.add_argument("--choice-tokens", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--rules", default="beam,oneshot,pll,l2r")
    p.add_argument("--backends", default="hf,megatron",
                   help="hf: the HF export layout; megatron: its megatron checkpoint (comma-separated)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: steadier on a shared machine; 0 leaves torch's)")
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    backends = args.backends.split(",")
    if set(backends) - {"hf", "megatron"}:
        p.error(f"--backends: hf and/or megatron, got {args.backends!r}")
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, corpus = sample_tokenizer(Path(tmp))
        pairs = build_requests(tokenizer, corpus, args.questions, args.context_tokens,
                               args.choices, args.choice_tokens)
        model = build_model(tokenizer, args.device)
        sources = {"hf": model}
        if "megatron" in backends:
            sources["megatron"] = megatron_checkpoint(model, tokenizer, Path(tmp))
        device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else \
            f"CPU, {torch.get_num_threads()} threads"
        print(f"tiny BiGLM, {device_name}; {len(pairs)} requests = {args.questions} questions x "
              f"{args.choices} choices, context ~{args.context_tokens} tokens, continuation "
              f"~{args.choice_tokens} tokens, batch {args.batch_size}")
        print("| backend | rule | passes/request | req/s reuse off | req/s reuse on | "
              "speed-up (on/off) | max |diff| on/off | max |diff| vs hf |")
        print("|---|---|---|---|---|---|---|---|")
        for rule in args.rules.split(","):
            reference = None
            for backend in backends:
                median, scores, passes = time_rule(
                    eval_lms(backend, sources[backend], tokenizer, rule, args.batch_size, args.device), pairs,
                    args.repeats)
                diff = max(abs(a - b) for a, b in zip(scores[False], scores[True]))
                reference = reference or scores[False]
                cross = max(abs(a - b) for a, b in zip(scores[True], reference))
                print(f"| {backend} | {rule} | {passes:.1f} | {len(pairs) / median[False]:.2f} | "
                      f"{len(pairs) / median[True]:.2f} | {median[False] / median[True]:.2f}x | "
                      f"{diff:.1e} | {cross:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
