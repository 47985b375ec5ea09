"""The zero-shot command's arguments, checked before the model loads: task names (with a
did-you-mean), model arguments (`k=v,...`, the keys our lm-eval models take, the scoring rule),
`--limit` and the output path.

Why: lm-eval reads each of these only after the model is loaded (minutes for a large
checkpoint), and then fails with a traceback: an unknown task, a model argument without `=`, a
scoring rule that does not exist, a limit of 0 (nothing scored), an output path that is a
directory (after every task ran). Each is one line here, naming the argument and what to write.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from pathlib import Path

from megatron_biglm.common.config_fields import did_you_mean
from megatron_biglm.common.output_path import output_file_problem


class BadArguments(ValueError):
    """An argument of the zero-shot command cannot be used; the message names it and the fix."""


def model_argument_names() -> list[str]:
    """The keys `biglm` and `hf-mlm` take (`evaluation/models.py`)."""
    from .models import HFMaskedLMEvalLM

    params = inspect.signature(HFMaskedLMEvalLM.__init__).parameters
    return [n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]


def check_model_arguments(text: str) -> dict[str, str]:
    """`--model-args` as {key: value} text; every part `key=value` with a known key, the scoring
    rule one of ours, `beam` and `batch_size` whole numbers >= 1, `path`/`pretrained` an existing
    local path."""
    from .scoring import RULES

    names = model_argument_names()
    args: dict[str, str] = {}
    for part in (p for p in text.strip().split(",") if p):  # as lm-eval splits it: spaces are kept
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            hint = f"path={part.strip()}" if Path(part.strip()).expanduser().exists() else "path=DIR"
            raise BadArguments(f"--model-args: {part!r} is not key=value; write e.g. {hint} "
                               "(k=v pairs separated by commas)")
        if key not in names:
            if key.strip() in names:
                raise BadArguments(f"--model-args: {part!r}: lm-eval keeps the spaces around a key; write "
                                   f"{key.strip()}={value} with no space after the comma")
            raise BadArguments(f"--model-args: unknown key {key!r}{did_you_mean([key], names)}; "
                               f"known keys: {', '.join(names)}")
        args[key] = value
    if "scoring" in args and args["scoring"] not in RULES:
        raise BadArguments(f"--model-args: scoring={args['scoring']!r} is not a scoring rule"
                           f"{did_you_mean([args['scoring']], list(RULES))}; choose one of {', '.join(RULES)}")
    for key in ("beam", "elbo_samples"):
        if key in args and not (args[key].isdigit() and int(args[key]) >= 1):
            raise BadArguments(f"--model-args: {key}={args[key]!r} must be a whole number >= 1")
    for key in ("path", "pretrained"):
        if key in args and not Path(args[key]).expanduser().exists():
            raise BadArguments(f"--model-args: {key}={args[key]} does not exist; give a local directory "
                               "(an HF export or a megatron checkpoint)")
    if not any(k in args for k in ("path", "pretrained")):
        raise BadArguments("--model-args: give the model as path=DIR (an HF export or a megatron checkpoint)")
    return args


def check_limit(limit: float | None) -> None:
    """lm-eval's `--limit`: a fraction of each task in (0, 1), or a whole number of documents >= 1."""
    if limit is None:
        return
    if not limit > 0:
        raise BadArguments(f"--limit {limit:g} scores no document; give a number of documents per task "
                           "(>= 1) or a fraction in (0, 1), or leave --limit out to score every document")
    if limit >= 1 and not float(limit).is_integer():
        raise BadArguments(f"--limit {limit:g}: a limit of 1 or more is a number of documents; give a "
                           "whole number, or a fraction below 1")


def check_output_file(path, flag: str = "--output") -> None:
    problem = output_file_problem(path, flag, "results.json")
    if problem:
        raise BadArguments(problem)


@lru_cache(maxsize=1)
def _builtin_task_names() -> frozenset[str]:
    """Every `task:` name of lm-eval's built-in YAMLs (what `--data-dir` can serve)."""
    import re

    from .tasks import lm_eval_tasks_dir

    pattern = re.compile(r"^task:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)
    names: set[str] = set()
    for path in lm_eval_tasks_dir().rglob("*.yaml"):
        names.update(pattern.findall(path.read_text(encoding="utf-8", errors="replace")))
    return frozenset(names)


def check_task_names(names: list[str], *, data_dir=None, known=None) -> None:
    """Every name a task lm-eval knows: with `--data-dir` a built-in task (its YAML is what the
    local data plugs into), else any task, group or tag of lm-eval's index. The paper's tasks
    are known without reading the index. `known`: the names to check against (default: lm-eval's)."""
    from .tasks import _BUILTIN_YAML

    unknown = [n for n in names if n not in _BUILTIN_YAML]
    if not unknown:
        return
    if known is None:
        if data_dir is not None:
            known = _builtin_task_names()
        else:
            from lm_eval.tasks import TaskManager

            known = set(TaskManager().all_tasks)
    bad = [n for n in unknown if n not in known]
    if bad:
        what = "built-in task" if data_dir is not None else "task, group or tag"
        raise BadArguments(f"--suite: lm-eval has no {what} {', '.join(map(repr, bad))}"
                           f"{did_you_mean(bad, sorted(known))}; use --suite paper or lm-eval's task names "
                           "(python -m megatron_biglm.cli.lm_eval list tasks)")
