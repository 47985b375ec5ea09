"""Real fine-tuning data without a hub: BIG-bench's gem/xsum and natural_instructions tasks,
from the PyPI sdist `bigbench==1.0.0` (358 MB download, once; ~165 MB kept in the cache).

* gem/xsum: 1,001 real XSUM (BBC article, one-sentence summary) pairs, written in the
  `xsum` schema (`id`, `document`, `summary`) so `data_files.read_rows(path, "xsum")` and the
  seq2seq task read them like any XSUM file.
* natural_instructions: 61 subtasks (~193k examples) of real instruction / input / target
  triples for instruction tuning, written as `instruction`, `input`, `output`
  (the first target; `outputs` keeps all of them) plus `task`.

Rows without an input or with an empty target are dropped and counted in a `RowReport`.
Cache: `$BIGLM_BIGBENCH_DIR`, else ~/.cache/megatron_biglm/bigbench. An already downloaded
sdist can be given with `$BIGLM_BIGBENCH_SDIST` (no pip call). Fetching raises
`CorpusUnavailable` when pip cannot reach the registry. The sdist declares a direct-URL
dependency, which pip >= 26 refuses even with --no-deps, so it is downloaded with pip 25.0.1
(see `sdist_fetch`).

    python -m megatron_biglm.cli.fetch_data bigbench --xsum xsum.jsonl
    python -m megatron_biglm.cli.fetch_data bigbench --instructions ni.jsonl --limit-per-task 100
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator, Sequence

from megatron_biglm.data.sdist_fetch import FALLBACK_PIP, cache_root, fetch_members
from megatron_biglm.finetune.row_report import EMPTY_TARGET, MISSING_FIELD, RowReport

PACKAGE = "bigbench==1.0.0"
_TASKS = "bigbench/benchmark_tasks/"
XSUM_TASK = "gem/xsum"
INSTRUCTIONS = "natural_instructions"


def cache_dir() -> Path:
    env = os.environ.get("BIGLM_BIGBENCH_DIR")
    return Path(env) if env else cache_root() / "bigbench"


def _wanted(name: str) -> str | None:
    """gem/xsum/task.json and natural_instructions/<subtask>/task.json, relative to the
    benchmark_tasks folder."""
    if not name.startswith(_TASKS) or not name.endswith("/task.json"):
        return None
    rel = name[len(_TASKS):]
    if rel == f"{XSUM_TASK}/task.json":
        return rel
    parts = rel.split("/")
    if len(parts) == 3 and parts[0] == INSTRUCTIONS and parts[1].startswith("subtask"):
        return rel
    return None


def fetch(target: Path | None = None) -> Path:
    """The cache folder holding the task.json files (downloaded and unpacked on first use)."""
    sdist = os.environ.get("BIGLM_BIGBENCH_SDIST")
    return fetch_members(PACKAGE, Path(target) if target else cache_dir(), _wanted,
                         sdist=Path(sdist) if sdist else None, pip=FALLBACK_PIP)


def _load_task(path: Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def xsum_rows(*, limit: int | None = None, report: RowReport | None = None,
              root: Path | None = None) -> Iterator[dict]:
    """{"id", "document", "summary"} rows of gem/xsum, in file order."""
    report = report if report is not None else RowReport()
    path = fetch(root) / XSUM_TASK / "task.json"
    kept = 0
    for number, example in enumerate(_load_task(path)["examples"], start=1):
        if limit is not None and kept >= limit:
            return
        report.rows_seen += 1
        document, summary = example.get("input"), example.get("target")
        if isinstance(summary, list):
            summary = summary[0] if summary else ""
        if not isinstance(document, str) or not document.strip():
            report.skip(MISSING_FIELD, path, number, "no input article")
            continue
        if not isinstance(summary, str) or not summary.strip():
            report.skip(EMPTY_TARGET, path, number, "empty summary")
            continue
        report.rows_kept += 1
        kept += 1
        yield {"id": example.get("comment", f"xsum-{number}"), "document": document, "summary": summary}


def instruction_subtasks(root: Path | None = None) -> list[str]:
    """The natural_instructions subtask names, sorted."""
    folder = fetch(root) / INSTRUCTIONS
    return sorted(p.parent.name for p in folder.glob("subtask*/task.json"))


def instruction_rows(subtasks: Sequence[str] | None = None, *, limit_per_task: int | None = None,
                     report: RowReport | None = None, root: Path | None = None) -> Iterator[dict]:
    """{"task", "instruction", "input", "output", "outputs"} rows. The instruction is the
    subtask's `task_prefix` (its definition and prompt), else its description."""
    report = report if report is not None else RowReport()
    folder = fetch(root) / INSTRUCTIONS
    for name in subtasks or instruction_subtasks(root):
        path = folder / name / "task.json"
        task = _load_task(path)
        instruction = (task.get("task_prefix") or task.get("description") or "").strip()
        kept = 0
        for number, example in enumerate(task["examples"], start=1):
            if limit_per_task is not None and kept >= limit_per_task:
                break
            report.rows_seen += 1
            text = example.get("input")
            targets = example.get("target")
            targets = [targets] if isinstance(targets, str) else list(targets or [])
            targets = [t for t in targets if isinstance(t, str) and t.strip()]
            if not isinstance(text, str) or not text.strip():
                report.skip(MISSING_FIELD, path, number, "no input")
                continue
            if not targets:
                report.skip(EMPTY_TARGET, path, number, "no non-empty target")
                continue
            report.rows_kept += 1
            kept += 1
            yield {"task": name, "instruction": instruction, "input": text, "output": targets[0],
                   "outputs": targets}


def write_jsonl(rows, path: Path) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    return count


def write_splits(rows, folder: Path, validation: int) -> dict[str, int]:
    """`folder/train.jsonl` and `folder/validation.jsonl` (the files a fine-tune config reads):
    the last `validation` rows are held out, the rest train. Returns the count per file."""
    rows = list(rows)
    if not 0 < validation < len(rows):
        raise ValueError(f"--validation {validation} must be between 1 and {len(rows) - 1} "
                         f"(the pairs fetched: {len(rows)}); raise --limit or lower --validation")
    cut = len(rows) - validation
    return {name: write_jsonl(part, Path(folder) / f"{name}.jsonl")
            for name, part in (("train", rows[:cut]), ("validation", rows[cut:]))}
