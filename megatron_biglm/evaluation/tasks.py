"""The paper's zero-shot suite, local task YAMLs for offline data, and the results table.

The paper (Tables 1 and 4) evaluates 11 lm-eval tasks zero-shot and reports acc_norm for PIQA,
ARC-C, LogiQA and HellaSwag, acc for the rest. TruthfulQA (MC) is lm-eval's `truthfulqa_mc1`
(its small-model scores, about 25, match the paper's column; mc2 would be about 40).

Offline data: `write_local_task_yamls` writes, per task, a YAML that `include`s lm-eval's
built-in config by absolute path (prompts, choices and `!function` preprocessors unchanged)
and only swaps the data source for a local jsonl in the task's HF schema. Users with a hub run
the built-in task names unchanged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Iterable

import yaml

from megatron_biglm.common.config_fields import did_you_mean

from .task_data_check import check_task_file
from .zero_shot_args import BadArguments


@dataclass(frozen=True)
class SuiteTask:
    """`name`: lm-eval task; `label`: column header; `metric`: the paper's metric."""

    name: str
    label: str
    metric: str


PAPER_SUITE: tuple[SuiteTask, ...] = (
    SuiteTask("arc_easy", "ARC-E", "acc"),
    SuiteTask("arc_challenge", "ARC-C", "acc_norm"),
    SuiteTask("piqa", "PIQA", "acc_norm"),
    SuiteTask("sciq", "SciQ", "acc"),
    SuiteTask("winogrande", "Wino.", "acc"),
    SuiteTask("logiqa", "LogiQA", "acc_norm"),
    SuiteTask("race", "RACE", "acc"),
    SuiteTask("social_iqa", "SIQA", "acc"),
    SuiteTask("boolq", "BoolQ", "acc"),
    SuiteTask("hellaswag", "Hella.", "acc_norm"),
    SuiteTask("truthfulqa_mc1", "Truth.", "acc"),
)

#: Built-in YAML of each suite task, relative to lm_eval/tasks (lm-eval 0.4.x layout).
_BUILTIN_YAML = {
    "arc_easy": "arc/arc_easy.yaml", "arc_challenge": "arc/arc_challenge.yaml",
    "piqa": "piqa/piqa.yaml", "sciq": "sciq/sciq.yaml", "winogrande": "winogrande/default.yaml",
    "logiqa": "logiqa/logiqa.yaml", "race": "race/race.yaml", "social_iqa": "siqa/siqa.yaml",
    "boolq": "super_glue/boolq/default.yaml", "hellaswag": "hellaswag/hellaswag.yaml",
    "truthfulqa_mc1": "truthfulqa/truthfulqa_mc1.yaml",
}


class MissingTaskData(FileNotFoundError):
    """Local data for some tasks was not found; the message lists the paths looked at."""


def resolve_tasks(spec: str) -> list[SuiteTask]:
    """`paper` or a comma-separated list of lm-eval task names (paper labels/metrics where
    known, otherwise the task name and `acc`)."""
    if spec.strip() == "paper":
        return list(PAPER_SUITE)
    known = {t.name: t for t in PAPER_SUITE}
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise BadArguments("no task given: name the suite `paper`, or tasks TASK[,TASK...]")
    return [known.get(n, SuiteTask(n, n, "acc")) for n in names]


@lru_cache(maxsize=1)
def _builtin_task_names() -> frozenset[str]:
    """Every `task:` name of lm-eval's built-in YAMLs (what `--data-dir` can serve)."""
    pattern = re.compile(r"^task:\s*['\"]?([^'\"\s#]+)", re.MULTILINE)
    names: set[str] = set()
    for path in lm_eval_tasks_dir().rglob("*.yaml"):
        names.update(pattern.findall(path.read_text(encoding="utf-8", errors="replace")))
    return frozenset(names)


def check_task_names(names: list[str], *, data_dir=None, known=None) -> None:
    """Every name a task lm-eval knows: with `--data-dir` a built-in task (its YAML is what the
    local data plugs into), else any task, group or tag of lm-eval's index. The paper's tasks
    are known without reading the index. `known`: the names to check against (default: lm-eval's)."""
    unknown = [n for n in names if n not in _BUILTIN_YAML]
    if not unknown:
        return
    if known is None:
        if data_dir is not None:
            known = _builtin_task_names()
        else:
            from lm_eval.tasks import TaskManager  # lazy: optional (eval extra)

            known = set(TaskManager().all_tasks)
    bad = [n for n in unknown if n not in known]
    if bad:
        what = "built-in task" if data_dir is not None else "task, group or tag"
        raise BadArguments(f"--suite: lm-eval has no {what} {', '.join(map(repr, bad))}"
                           f"{did_you_mean(bad, sorted(known))}; use --suite paper or lm-eval's task names "
                           "(python -m megatron_biglm.cli.lm_eval list tasks)")


def lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks  # lazy: optional (eval extra)

    return Path(lm_eval.tasks.__file__).parent


def builtin_task_yaml(name: str) -> Path:
    """The built-in YAML defining task `name` (table lookup, else a scan for `task: name`)."""
    root = lm_eval_tasks_dir()
    if name in _BUILTIN_YAML and (root / _BUILTIN_YAML[name]).is_file():
        return root / _BUILTIN_YAML[name]
    pattern = re.compile(rf"^task:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.MULTILINE)
    for path in sorted(root.rglob("*.yaml")):
        if pattern.search(path.read_text(encoding="utf-8", errors="replace")):
            return path
    raise KeyError(f"lm-eval {_lm_eval_version()} has no built-in task {name!r}")


def evaluation_split(yaml_path: Path) -> str:
    """The split lm-eval scores: test if the task has one, else validation."""
    from lm_eval.tasks._yaml_loader import load_yaml  # lazy: optional (eval extra)

    cfg = load_yaml(yaml_path, resolve_func=False)
    split = cfg.get("test_split") or cfg.get("validation_split")
    if not split:
        raise ValueError(f"{yaml_path} names neither a test nor a validation split")
    return str(split)


def task_data_candidates(data_dir: Path, task: str, split: str) -> list[Path]:
    """Where `--data-dir` may hold a task's evaluation split, in order of preference."""
    data_dir = Path(data_dir)
    return [data_dir / f"{task}.jsonl", data_dir / task / f"{split}.jsonl"]


def write_local_task_yamls(tasks: Iterable[str], data_dir, out_dir, *,
                           skip_missing: bool = False) -> tuple[dict[str, Path], list[str]]:
    """Write `<out_dir>/<task>.yaml` for each task with local data; return (written, skipped).

    Missing data raises `MissingTaskData` listing every path tried, unless `skip_missing`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, missing = {}, {}
    for task in tasks:
        builtin = builtin_task_yaml(task)
        split = evaluation_split(builtin)
        candidates = task_data_candidates(data_dir, task, split)
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            missing[task] = candidates
            continue
        check_task_file(task, found)  # a bad row fails here, naming file:line, not inside lm-eval
        config = {
            "include": str(builtin.resolve()),
            "task": task,
            "tag": [],
            "dataset_path": "json",
            "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(found.resolve())}},
            "training_split": None,
            "validation_split": split if split == "validation" else None,
            "test_split": split if split == "test" else None,
            "fewshot_split": None,
        }
        path = out_dir / f"{task}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        written[task] = path
    if missing and not skip_missing:
        lines = "\n".join(f"  {t}: " + " or ".join(str(p) for p in ps) for t, ps in missing.items())
        raise MissingTaskData(f"no local data for {len(missing)} task(s):\n{lines}\n"
                              "Write each task's evaluation split as jsonl in its HF schema, "
                              "or pass --skip-missing to run the others.")
    return written, sorted(missing)


def local_task_manager(yaml_dir):
    """A TaskManager that indexes only our generated YAMLs (the full built-in index takes
    ~10 s; the includes still resolve to the built-in files)."""
    from lm_eval.tasks import TaskManager  # lazy: optional (eval extra)

    return TaskManager(include_path=str(yaml_dir), include_defaults=False)


def metric_value(results: dict, task: str, metric: str) -> float | None:
    """The task's metric from lm-eval's results dict (None if the task did not run)."""
    entry = results.get("results", {}).get(task)
    if entry is None:
        return None
    value = entry.get(f"{metric},none", entry.get(metric))
    return None if value is None else float(value)


def suite_scores(results: dict, tasks: list[SuiteTask]) -> dict[str, float | None]:
    """task name -> metric value in percent (the paper's unit)."""
    out = {}
    for t in tasks:
        value = metric_value(results, t.name, t.metric)
        out[t.name] = None if value is None else 100.0 * value
    return out


def average(scores: dict[str, float | None]) -> float | None:
    present = [v for v in scores.values() if v is not None]
    return sum(present) / len(present) if present else None


def format_table(rows: list[tuple[str, dict[str, float | None]]], tasks: list[SuiteTask]) -> str:
    """A Markdown table like the paper's Table 1/4: one row per model, metric row under the
    header, AVG. over the tasks that ran (a footnote says how many when some are missing)."""
    header = ["Model"] + [t.label for t in tasks] + ["AVG."]
    metrics = [""] + [t.metric for t in tasks] + [""]
    lines = [_row(header), _row(["---"] * len(header)), _row(metrics)]
    notes = []
    for name, scores in rows:
        cells = [name] + [_cell(scores.get(t.name)) for t in tasks]
        avg = average({t.name: scores.get(t.name) for t in tasks})
        lines.append(_row(cells + [_cell(avg)]))
        ran = sum(scores.get(t.name) is not None for t in tasks)
        if ran < len(tasks):
            notes.append(f"{name}: AVG. over {ran} of {len(tasks)} tasks ('-' did not run)")
    return "\n".join(lines + notes)


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _lm_eval_version() -> str:
    return version("lm_eval")
