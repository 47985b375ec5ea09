"""The kind owns its planning: a fine-tune whose task lists no labels reads each data file's
rows once, for its labels and its rows, over the whole run (planning, training, validation,
test). The one other open of each file is the run directory's claim, which records the
files' sha256 (`run/run_claim.py`)."""
from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest

from finetune_entry_fixtures import tiny_run, write_task

_OPENS: Counter = Counter()   # (path, "rows" or "other")
_WATCHED: set = set()


def _hook(event, args):
    """Counts the opens of the watched files (an audit hook stays for the process: it only
    counts the paths of the test that set `_WATCHED`)."""
    if event == "open" and _WATCHED and args and isinstance(args[0], (str, os.PathLike)):
        path = os.path.abspath(os.fspath(args[0]))
        if path in _WATCHED:
            _OPENS[path, "rows" if _from_row_reader() else "other"] += 1


def _from_row_reader() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("megatron_biglm", "data", "rows.py")):
            return True
        frame = frame.f_back
    return False


_installed = []


@pytest.mark.slow
def test_a_finetune_reads_each_data_file_once_labels_included(tmp_path):
    from megatron_biglm.cli.finetune import main

    if not _installed:
        sys.addaudithook(_hook)
        _installed.append(True)
    task = write_task(tmp_path / "data", n_train=32, n_valid=16, n_test=16)
    run = tmp_path / "run"
    config = tmp_path / "head.yaml"  # labels left out: inferred from the training split
    config.write_text("finetune:\n  task: {kind: head, fields: [premise, hypothesis]}\n")
    over = {**tiny_run(task, run, lr=3e-3, batch=16, log_interval=1),
            "finetune.max_length": 16, "finetune.epochs": 1, "finetune.test_split": "test",
            **{f"finetune.data.{split}": path for split, path in task["files"].items()}}
    files = {os.path.abspath(p) for p in task["files"].values()}
    _OPENS.clear()
    _WATCHED.update(files)
    try:
        assert main(["--config", str(config), *(f"{k}={v}" for k, v in over.items())]) == 0
    finally:
        _WATCHED.clear()
    assert dict(_OPENS) == {**{(path, "rows"): 1 for path in files}, **{(path, "other"): 1 for path in files}}
    results = json.loads((run / "results.json").read_text())
    assert results["finished"] and "test" in results["test"]
