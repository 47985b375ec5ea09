"""MMLU zero-shot and k-shot through lm-eval's own `mmlu` tasks (paper Table 5, "ZS / FS").

The score is lm-eval's `mmlu` group number: accuracy over all questions of the 57 subjects
(`aggregate_metric_list: acc, weight_by_size: True`), i.e. correct / total, computed here from
the per-subject results so that it is the same number whether the data came from the hub or
from local files. k-shot examples are the first k of the subject's `dev` split (lm-eval's
`first_n` sampler, MMLU's canonical few-shot set).

Where the data comes from:
  * hub (no `data`): the built-in `mmlu_<subject>` tasks, loading `cais/mmlu` as usual. Offline
    that load fails; `MMLUDataUnavailable` says so and names the two offline fixes below.
  * a directory: per subject `<dir>/<subject>/test.jsonl` (or `<dir>/<subject>.jsonl`) and, for
    k > 0, `<dir>/<subject>/dev.jsonl`, in the `cais/mmlu` schema (question, choices: 4
    strings, answer: 0-3). One YAML per subject `include`s lm-eval's built-in config by
    absolute path (prompt, choices, description unchanged) and swaps only the data source.
  * `SMOKE` ("lm-eval-smoke"): the MMLU dev questions lm-eval itself ships, as the few-shot
    samples of its `flan_cot_fewshot` configs (281 usable four-choice questions, 3-5 per
    subject). They are written as both test and dev split; lm-eval's sampler leaves the
    question being asked out of its own shots, so k <= 2. A smoke run of the pipeline, not
    MMLU's test set: never report it as MMLU.
"""
from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import yaml

from .task_data_check import check_task_file
from .tasks import lm_eval_tasks_dir, local_task_manager

SMOKE = "lm-eval-smoke"
_CHOICES = re.compile(r"(.*?)\n\(A\)\s*(.*?)\s*\(B\)\s*(.*?)\s*\(C\)\s*(.*?)\s*\(D\)\s*(.*?)\s*\Z", re.S)
_ANSWER = re.compile(r"answer is \(([A-D])\)")


class MMLUDataUnavailable(RuntimeError):
    """MMLU's data could not be loaded; the message names the offline fixes."""


@dataclass
class MMLUResult:
    """Accuracy (fraction) over all questions, per subject, and the questions counted."""
    shots: int
    accuracy: float
    per_subject: dict[str, float]
    questions: dict[str, int]
    source: str

    def to_json(self) -> dict:
        return {"shots": self.shots, "accuracy": self.accuracy, "source": self.source,
                "questions": sum(self.questions.values()), "subjects": len(self.per_subject),
                "per_subject": self.per_subject}


def _mmlu_dir() -> Path:
    return lm_eval_tasks_dir() / "mmlu"


def subjects(only=None) -> list[str]:
    """The 57 subjects, as lm-eval's default MMLU configs name them (or those of `only`,
    checked against them)."""
    names = sorted(p.stem[len("mmlu_"):] for p in (_mmlu_dir() / "default").glob("mmlu_*.yaml"))
    if not names:
        raise MMLUDataUnavailable(f"no MMLU task configs under {_mmlu_dir()}; is lm-eval installed?")
    if only:
        unknown = [s for s in only if s not in names]
        if unknown:
            raise MMLUDataUnavailable(f"unknown MMLU subject(s) {', '.join(unknown)}; lm-eval names "
                                      f"them like {', '.join(names[:3])}, ...")
        return [s for s in names if s in set(only)]
    return names


def shipped_dev_questions() -> dict[str, list[dict]]:
    """subject -> the MMLU dev questions lm-eval ships (its flan_cot_fewshot samples), in the
    cais/mmlu schema. A sample that is not four choices and a lettered answer is skipped."""
    out: dict[str, list[dict]] = {}
    for subject in subjects():
        path = _mmlu_dir() / "flan_cot_fewshot" / f"mmlu_{subject}.yaml"
        config = yaml.safe_load(path.read_text(encoding="utf-8")) if path.is_file() else {}
        samples = (config.get("fewshot_config") or {}).get("samples") or []
        rows = []
        for sample in samples:
            m = _CHOICES.match(sample.get("question", ""))
            answer = _ANSWER.findall(sample.get("target", ""))
            if m and answer and "(E)" not in m.group(5):
                rows.append({"question": m.group(1).strip(), "subject": subject,
                             "choices": [m.group(i) for i in range(2, 6)], "answer": "ABCD".index(answer[-1])})
        if rows:
            out[subject] = rows
    if not out:
        raise MMLUDataUnavailable(f"lm-eval {_version()} ships no parsable MMLU questions under "
                                  f"{_mmlu_dir() / 'flan_cot_fewshot'}")
    return out


def write_smoke_data(out_dir) -> Path:
    """The shipped questions as `<out_dir>/<subject>/{test,dev}.jsonl` (see the module doc)."""
    out_dir = Path(out_dir)
    for subject, rows in shipped_dev_questions().items():
        (out_dir / subject).mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r) + "\n" for r in rows)
        for split in ("test", "dev"):
            (out_dir / subject / f"{split}.jsonl").write_text(text, encoding="utf-8")
    return out_dir


def check_smoke_shots(shots: int, only=None) -> None:
    """k-shot on the smoke set needs k other questions in every subject asked for."""
    shipped = shipped_dev_questions()
    fewest = min(len(shipped[s]) for s in subjects(only) if s in shipped)
    if shots > fewest - 1:
        raise MMLUDataUnavailable(
            f"the {SMOKE} set has only {fewest} questions in some subjects, so at most "
            f"{fewest - 1}-shot (a question is never its own shot); use --mmlu-shots up to "
            f"{fewest - 1}, or real MMLU data (--mmlu-data DIR)")


def _local_files(data_dir: Path, subject: str) -> tuple[Path | None, Path | None]:
    test = next((p for p in (data_dir / subject / "test.jsonl", data_dir / f"{subject}.jsonl")
                 if p.is_file()), None)
    dev = data_dir / subject / "dev.jsonl"
    return test, dev if dev.is_file() else None


def write_local_yamls(data_dir, out_dir, shots: int, only=None) -> list[str]:
    """One task YAML per subject with local test data; returns the task names. Raises
    MMLUDataUnavailable when no subject has data, or k > 0 and a subject has no dev split."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    if not data_dir.is_dir():
        raise MMLUDataUnavailable(f"--mmlu-data {data_dir} is not a directory; give a directory of "
                                  f"<subject>/test.jsonl (+ dev.jsonl) in the cais/mmlu schema, or {SMOKE}")
    out_dir.mkdir(parents=True, exist_ok=True)
    names, no_dev = [], []
    for subject in subjects(only):
        test, dev = _local_files(data_dir, subject)
        if test is None:
            continue
        check_task_file("mmlu", test)
        if dev is not None:
            check_task_file("mmlu", dev)
        elif shots > 0:
            no_dev.append(subject)
        files = {"test": str(test.resolve())} | ({"dev": str(dev.resolve())} if dev else {})
        config = {"include": str((_mmlu_dir() / "default" / f"mmlu_{subject}.yaml").resolve()),
                  "task": f"mmlu_{subject}", "tag": [], "dataset_path": "json", "dataset_name": None,
                  "dataset_kwargs": {"data_files": files}, "test_split": "test",
                  "fewshot_split": "dev" if dev else None}
        (out_dir / f"mmlu_{subject}.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        names.append(f"mmlu_{subject}")
    if not names:
        raise MMLUDataUnavailable(f"no MMLU subject has test data in {data_dir}: write "
                                  f"<subject>/test.jsonl for subjects named as lm-eval names them "
                                  f"(e.g. {subjects()[0]}), in the cais/mmlu schema")
    if no_dev:
        raise MMLUDataUnavailable(f"{shots}-shot needs <subject>/dev.jsonl (the few-shot examples) "
                                  f"for {len(no_dev)} subject(s) in {data_dir}, e.g. {no_dev[0]}")
    return names


def run_mmlu(lm, shots: int, *, data=None, limit=None, only=None) -> MMLUResult:
    """MMLU accuracy with `lm` (an lm-eval LM object) at `shots` examples; `data`: None (hub),
    a directory, or SMOKE (see the module doc); `only`: a subset of subjects (quick runs)."""
    import lm_eval  # lazy: optional (eval extra)

    if shots < 0:
        raise ValueError(f"MMLU shots must be >= 0, got {shots}")
    with tempfile.TemporaryDirectory(prefix="biglm-mmlu-") as tmp:
        if data is None:
            check_hub()
            names, manager, source = [f"mmlu_{s}" for s in subjects(only)], None, "hub: cais/mmlu"
        else:
            data_dir = Path(data) if str(data) != SMOKE else write_smoke_data(Path(tmp) / "data")
            if str(data) == SMOKE:
                check_smoke_shots(shots, only)
            names = write_local_yamls(data_dir, Path(tmp) / "tasks", shots, only)
            manager = local_task_manager(Path(tmp) / "tasks")
            source = SMOKE if str(data) == SMOKE else str(Path(data).resolve())
        results = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager,
                                          num_fewshot=shots, limit=limit, log_samples=False)
    return summarize(results, names, shots, source)


def check_hub() -> None:
    """Load one subject's dev split first (from the hub or the local `datasets` cache), so an
    offline machine fails once, at once, with the fix, instead of 57 times inside lm-eval."""
    import datasets  # lazy: start-up (datasets: 0.9 CPU s)

    try:
        datasets.load_dataset("cais/mmlu", subjects()[0], split="dev")
    except Exception as exc:  # the datasets/hub stack raises many types when it is offline
        raise MMLUDataUnavailable(
            f"could not load MMLU from the hub (cais/mmlu): {type(exc).__name__}: {exc}\n"
            f"Offline: pass --mmlu-data DIR (<subject>/test.jsonl and dev.jsonl in the cais/mmlu "
            f"schema), or --mmlu-data {SMOKE} for a smoke run on the MMLU dev questions lm-eval "
            f"ships (set HF_DATASETS_OFFLINE=1 to fail without waiting for network retries)") from exc


def summarize(results: dict, names: list[str], shots: int, source: str) -> MMLUResult:
    """Correct / total over the subjects that ran (= lm-eval's size-weighted group acc)."""
    per_subject, counts = {}, {}
    for name in names:
        entry = results["results"].get(name)
        if entry is None:
            continue
        per_subject[name[len("mmlu_"):]] = float(entry["acc,none"])
        counts[name[len("mmlu_"):]] = int(results["n-samples"][name]["effective"])
    total = sum(counts.values())
    if not total:
        raise MMLUDataUnavailable("lm-eval scored no MMLU question")
    accuracy = sum(per_subject[s] * counts[s] for s in counts) / total
    return MMLUResult(shots, accuracy, per_subject, counts, source)


def _version() -> str:
    return version("lm_eval")
