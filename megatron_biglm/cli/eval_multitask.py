"""`python -m megatron_biglm.cli.eval_multitask`: the paper's Table 5 row for one model (multitask evaluation
after instruction tuning): MMLU zero-/k-shot, SuperGLUE average, Genset BLEU-2 / Distinct-2.

    python -m megatron_biglm.cli.eval_multitask --model PATH --mmlu-shots 0 5 [--mmlu-data DIR|lm-eval-smoke] \
        --superglue-data SG_DIR --genset genset.jsonl --max-new-tokens 32 --steps 10 \
        [--genset-template default] --output multitask.json

PATH is an HF export or a megatron checkpoint, loaded once for all three sections by the one
inference loader: a megatron checkpoint runs as it was trained (split attention for BiGLM, full
attention for an mlm baseline), an HF export with split attention (`--split-attention` overrides
both). A section
whose input is not given is reported as skipped, with the reason, in the table and the JSON.
Bad input (a missing file, rows in the wrong schema, MMLU unreachable offline) prints
`error: ...` saying what to do and exits with status 2, before the model is loaded where it
can be checked that early.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from megatron_biglm.checkpoint.dirs import CheckpointError
from megatron_biglm.cli.generate import BadInput, add_decoding_args, config_from_args
from megatron_biglm.common.config_flags import parse_flags
from megatron_biglm.evaluation.mmlu import SMOKE, MMLUDataUnavailable
from megatron_biglm.evaluation.task_data_check import BadTaskData
from megatron_biglm.experiments.multitask.genset import BadGensetData
from megatron_biglm.experiments.multitask.superglue import BadSuperGLUEData
from megatron_biglm.generation.config import GenerationConfigError

EXIT_BAD_INPUT = 2
BAD_INPUT = (BadInput, BadGensetData, BadSuperGLUEData, BadTaskData, MMLUDataUnavailable,
             GenerationConfigError, CheckpointError, FileNotFoundError, ValueError)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", required=True, help="HF export directory or megatron checkpoint")
    p.add_argument("--label", help="row name in the table (default: the model directory's name)")
    p.add_argument("--output", type=Path, help="write the results JSON here")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--dtype", help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--batch-size", type=int, default=16, help="rows per forward pass (scoring)")
    p.add_argument("--split-attention", choices=("on", "off"), default=None,
                   help="on: prefix rows never see the answer slots (BiGLM as trained); off: full "
                        "attention. Default: as the megatron checkpoint was trained (its "
                        "objective.variant), on for an HF export")
    mmlu = p.add_argument_group("MMLU (lm-eval's mmlu tasks through our masked-LM backend)")
    mmlu.add_argument("--mmlu-shots", type=int, nargs="+", help="e.g. 0 5 (ZS / FS)")
    mmlu.add_argument("--mmlu-data", help=f"local cais/mmlu jsonl: DIR/<subject>/test.jsonl (+ dev.jsonl "
                      f"for k > 0), or {SMOKE} (the dev questions lm-eval ships; k <= 2; a smoke "
                      "run, not MMLU). Default: the hub")
    mmlu.add_argument("--mmlu-limit", type=float, help="questions per subject (quick runs only)")
    mmlu.add_argument("--mmlu-subjects", nargs="+", help="only these subjects (quick runs only)")
    mmlu.add_argument("--scoring", default="beam", help="scoring rule of the lm-eval backend")
    sg = p.add_argument_group("SuperGLUE (zero-shot prompted verbalizer tasks)")
    sg.add_argument("--superglue-data", type=Path,
                    help="DIR of <task>.jsonl (boolq, cb, copa, rte, wic) in the super_glue schema")
    gen = p.add_argument_group("Genset (Mask-Predict generation)")
    gen.add_argument("--genset", type=Path, help="jsonl of {\"source\", \"reference\"} pairs")
    gen.add_argument("--genset-template", choices=("none", "default", "plain"), default="none",
                     help="wrap each source in this instruction-tuning chat template")
    gen.add_argument("--gen-batch-size", type=int, default=8)
    add_decoding_args(gen)
    return p


def check_inputs(args) -> None:
    """Everything that can be checked without the model, so bad input fails in seconds."""
    from megatron_biglm.evaluation.mmlu import check_hub, check_smoke_shots, write_local_yamls

    if args.mmlu_shots and any(k < 0 for k in args.mmlu_shots):
        raise BadInput(f"--mmlu-shots must be >= 0, got {args.mmlu_shots}")
    if args.mmlu_shots and args.mmlu_data is None:
        check_hub()
    if args.mmlu_shots and args.mmlu_data == SMOKE:
        check_smoke_shots(max(args.mmlu_shots), args.mmlu_subjects)
    if args.mmlu_shots and args.mmlu_data not in (None, SMOKE):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            write_local_yamls(args.mmlu_data, tmp, max(args.mmlu_shots), args.mmlu_subjects)
    if args.superglue_data is not None:
        from megatron_biglm.experiments.multitask.superglue import check_superglue_dir

        check_superglue_dir(args.superglue_data)
    if args.genset is not None:
        from megatron_biglm.experiments.multitask.genset import read_pairs

        read_pairs(args.genset)
        config_from_args(args)


def run_multitask(args) -> dict:
    """All sections for one model; returns the results dict (with the Table 5 `row`)."""
    from megatron_biglm.evaluation.lm import MaskedLMEvalLM
    from megatron_biglm.evaluation.mmlu import run_mmlu
    from megatron_biglm.experiments.multitask.genset import evaluate_genset
    from megatron_biglm.experiments.multitask.superglue import evaluate_superglue
    from megatron_biglm.experiments.multitask.table import format_row
    from megatron_biglm.generation import MaskPredictGenerator
    from megatron_biglm.inference.loading import load_adapter

    loaded = load_adapter(args.model, device=args.device, dtype=args.dtype,
                          split_attention=args.split_attention)
    adapter, tokenizer = loaded.adapter, loaded.tokenizer
    report = {"model": str(args.model), "label": args.label or Path(args.model).name,
              "model_info": adapter.describe()}
    if args.mmlu_shots:
        lm = MaskedLMEvalLM(adapter, tokenizer, scoring=args.scoring, batch_size=args.batch_size,
                            progress=False)
        runs = {}
        for k in args.mmlu_shots:
            before = lm.truncated_contexts
            runs[str(k)] = run_mmlu(lm, k, data=args.mmlu_data, limit=args.mmlu_limit,
                                    only=args.mmlu_subjects).to_json()
            runs[str(k)]["contexts_truncated_left"] = lm.truncated_contexts - before
        report["mmlu"] = {"runs": runs, "source": next(iter(runs.values()))["source"],
                          "metric": "accuracy over all questions (lm-eval's mmlu group, weight_by_size)",
                          "subjects_only": args.mmlu_subjects, "limit": args.mmlu_limit}
    else:
        report["mmlu"] = {"skipped": "no --mmlu-shots given"}
    if args.superglue_data is not None:
        report["superglue"] = evaluate_superglue(adapter, tokenizer, args.superglue_data,
                                                 batch_size=args.batch_size)
    else:
        report["superglue"] = {"skipped": "no --superglue-data given"}
    if args.genset is not None:
        config = config_from_args(args)
        template = None if args.genset_template == "none" else args.genset_template
        report["genset"] = evaluate_genset(MaskPredictGenerator(adapter, tokenizer), args.genset, config,
                                           template=template, batch_size=args.gen_batch_size)
        report["genset"]["generation_config"] = config.to_dict()
    else:
        report["genset"] = {"skipped": "no --genset given"}
    report["row"] = format_row(report["label"], report)
    return report


def main(argv: list[str] | None = None, *, stdout=None, stderr=None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    args = parse_flags(build_parser(), argv)  # exits with status 2 on bad flags
    try:
        if not (args.mmlu_shots or args.superglue_data or args.genset):
            raise BadInput("nothing to evaluate: give --mmlu-shots, --superglue-data and/or --genset")
        check_inputs(args)
        report = run_multitask(args)
    except BAD_INPUT as exc:
        print(f"error: {exc}", file=stderr)
        return EXIT_BAD_INPUT
    print(report["row"], file=stdout)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
        print(f"wrote {args.output}", file=stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
