"""The GPU run's JSON, rewritten atomically after every row, so a killed run still leaves
every figure it measured on disk.

Each write goes to a temporary file in the same folder, is flushed to disk, and replaces the
JSON in one `os.replace`: a reader (or the next call's `--resume`) sees the old file or the
new one, never half of one.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

JSON_NAME = "gpu_acceptance.json"


def write_atomic(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Results:
    """The run's results: `meta`, one entry per section (its figures, or its failure), the
    headline figures at the top level, and `sections` (each section's status, elapsed time,
    budget, error and compile counts). `save()` after every change."""

    def __init__(self, folder: Path, meta: dict, previous: dict | None = None):
        self.path = Path(folder) / JSON_NAME
        self.data = dict(previous or {})
        self.data["meta"] = {**self.data.get("meta", {}), **meta}
        self.data.setdefault("sections", {})

    @classmethod
    def load(cls, folder: Path) -> dict | None:
        """The JSON a previous call left in `folder`, or None."""
        path = Path(folder) / JSON_NAME
        if not path.exists():
            return None
        return json.loads(path.read_text(encoding="utf-8"))

    def produced(self, name: str) -> bool:
        """Whether section `name` has figures (a finished or partial row) in the JSON."""
        status = self.data["sections"].get(name, {}).get("status")
        return status == "ok"

    def row(self, section: str, key: str, value) -> None:
        """One row of a section that is still running (e.g. one preset), saved at once."""
        self.data.setdefault(section, {})[key] = value
        self.save()

    def finish(self, section: str, figures: dict | None, record: dict) -> None:
        if figures is not None:
            self.data[section] = {**self.data.get(section, {}), **figures}
        self.data["sections"][section] = record
        self.save()

    def save(self) -> None:
        write_atomic(self.path, self.data)
