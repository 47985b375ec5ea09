"""The zero-shot command's arguments, checked before the model loads: model arguments
(`k=v,...`, the keys our lm-eval models take, the scoring rule), `--limit` and the output path
(task names: `tasks.check_task_names`).

Why: lm-eval reads each of these only after the model is loaded (minutes for a large
checkpoint), and then fails with a traceback: a model argument without `=`, a scoring rule that
does not exist, a limit of 0 (nothing scored), an output path that is a directory (after every
task ran). Each is one line here, naming the argument and what to write.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from megatron_biglm.common.config_fields import did_you_mean
from megatron_biglm.common.output_path import output_file_problem

from .models import HFMaskedLMEvalLM
from .scoring import RULES


class BadArguments(ValueError):
    """An argument of the zero-shot command cannot be used; the message names it and the fix."""


def model_argument_names() -> list[str]:
    """The keys `biglm` and `hf-mlm` take (`evaluation/models.py`)."""
    params = inspect.signature(HFMaskedLMEvalLM.__init__).parameters
    return [n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]


def check_model_arguments(text: str) -> dict[str, str]:
    """`--model-args` as {key: value} text; every part `key=value` with a known key, the scoring
    rule one of ours, `beam` and `batch_size` whole numbers >= 1, `path`/`pretrained` an existing
    local path."""
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
