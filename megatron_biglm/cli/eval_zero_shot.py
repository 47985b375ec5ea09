"""`python -m megatron_biglm.cli.eval_zero_shot`: run a zero-shot suite with a masked LM, print the paper-style
table, write lm-eval's results JSON.

    python -m megatron_biglm.cli.eval_zero_shot --model biglm --model-args path=DIR,scoring=beam \
        --suite paper --data-dir DATA --output results.json

`--data-dir` holds `<task>.jsonl` (or `<task>/<split>.jsonl`) in each task's HF schema
(`--skip-missing` runs the tasks that have files and lists the rest); without it the built-in
tasks load their data from the HF hub as usual, and a machine without the hub stops with one
line naming `--data-dir`. `--model-args path=` takes a local directory (an HF export or a
megatron checkpoint), never a hub name. The arguments (task names, model arguments, `--limit`,
`--output`) and the local rows are checked before the model loads: a mistake is one line
`error: ...` naming it (exit 1).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from megatron_biglm.cli import refuse
from megatron_biglm.common.hub import HubUnavailable, hub_access
from megatron_biglm.evaluation import register_lm_eval_models
from megatron_biglm.evaluation.tasks import (
    MissingTaskData,
    SuiteTask,
    average,
    format_table,
    local_task_manager,
    resolve_tasks,
    suite_scores,
    write_local_task_yamls,
)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=["biglm", "hf-mlm"])
    p.add_argument("--model-args", default="", help="k=v,... e.g. path=DIR,scoring=beam,beam=1")
    p.add_argument("--suite", default="paper", help="'paper' or TASK[,TASK...] (lm-eval names)")
    p.add_argument("--data-dir", type=Path, help="local task data (offline); see module doc")
    p.add_argument("--skip-missing", action="store_true",
                   help="with --data-dir: run the tasks that have data, list the rest as skipped")
    p.add_argument("--task-dir", type=Path, help="where to write the generated task YAMLs "
                   "(default: a temporary directory)")
    p.add_argument("--output", type=Path, help="write lm-eval's results JSON here")
    p.add_argument("--limit", type=float, help="documents per task (quick runs only)")
    p.add_argument("--batch-size", type=int, help="rows per forward pass (overrides model args)")
    p.add_argument("--device", help="e.g. cpu, cuda:0")
    p.add_argument("--label", help="row name in the table (default: the model path)")
    p.add_argument("--log-samples", action="store_true", help="keep per-document outputs in the JSON")
    return p


def run_zero_shot(model: str, model_args: str | dict, tasks: list[SuiteTask], *, data_dir=None,
                  task_dir=None, skip_missing: bool = False, limit=None, batch_size=None,
                  device=None, log_samples: bool = False) -> tuple[dict, list[str]]:
    """lm-eval results for `tasks` and the names skipped for lack of local data."""
    import lm_eval

    register_lm_eval_models()
    names, skipped, manager = [t.name for t in tasks], [], None
    with tempfile.TemporaryDirectory(prefix="biglm-tasks-") as tmp:
        if data_dir is not None:
            written, skipped = write_local_task_yamls(names, data_dir, task_dir or tmp,
                                                      skip_missing=skip_missing)
            names = [n for n in names if n in written]
            if not names:
                raise SystemExit("no task has local data; nothing to run")
            manager = local_task_manager(task_dir or tmp)
        instead = ("--data-dir DIR (each task's <task>.jsonl in its HF schema; --skip-missing runs "
                   "the tasks that have files)")
        with hub_access(f"the data of {', '.join(names)}", instead):
            results = lm_eval.simple_evaluate(
                model=model, model_args=model_args, tasks=names, task_manager=manager,
                limit=limit, batch_size=batch_size, device=device, log_samples=log_samples)
    return results, skipped


def summarize(results: dict, tasks: list[SuiteTask], skipped: list[str], label: str) -> dict:
    """The suite block added to the JSON: per-task paper metric (percent), AVG., table."""
    scores = suite_scores(results, tasks)
    return {"tasks": {t.name: {"label": t.label, "metric": t.metric, "score": scores[t.name]}
                      for t in tasks},
            "average": average(scores), "skipped_for_missing_data": skipped,
            "table": format_table([(label, scores)], tasks)}


def main(argv: list[str] | None = None) -> int:
    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.evaluation.task_data_check import BadTaskData
    from megatron_biglm.evaluation.tasks import check_task_names
    from megatron_biglm.evaluation.zero_shot_args import (
        BadArguments,
        check_limit,
        check_model_arguments,
        check_output_file,
    )

    args = build_parser().parse_args(argv)
    try:  # every argument is checked before lm-eval loads the model
        check_model_arguments(args.model_args)
        check_limit(args.limit)
        check_output_file(args.output)
        tasks = resolve_tasks(args.suite)
        check_task_names([t.name for t in tasks], data_dir=args.data_dir)
        results, skipped = run_zero_shot(
            args.model, args.model_args, tasks, data_dir=args.data_dir, task_dir=args.task_dir,
            skip_missing=args.skip_missing, limit=args.limit, batch_size=args.batch_size,
            device=args.device, log_samples=args.log_samples)
    except (BadArguments, BadTaskData, MissingTaskData, CheckpointError, HubUnavailable, FileNotFoundError) as exc:
        # bad input or no hub: the message, exit 1
        return refuse(exc, 1)
    label = args.label or _model_label(args.model, args.model_args)
    suite = summarize(results, tasks, skipped, label)
    results["zero_shot_suite"] = suite
    print(suite["table"])
    if skipped:
        print(f"skipped {len(skipped)} task(s) without local data: {', '.join(skipped)}")
    if args.output:
        from lm_eval.utils import handle_non_serializable

        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(results, indent=2, default=handle_non_serializable))
        print(f"wrote {args.output}")
    return 0


def _model_label(model: str, model_args: str) -> str:
    for part in model_args.split(","):
        key, _, value = part.partition("=")
        if key.strip() in ("path", "pretrained") and value:
            return f"{model}:{Path(value).name}"
    return model


if __name__ == "__main__":
    sys.exit(main())
