"""The one check of an output file's path a command writes at its end, run before its work.

Why: a command that generates or evaluates for minutes and then finds `--output` to be a
directory (or under a file) fails with a traceback and loses the work; checked first, it is one
line naming the flag.
"""
from __future__ import annotations

from pathlib import Path


def output_file_problem(path, flag: str = "--output", example: str = "out.jsonl") -> str | None:
    """Why `path` cannot be written as a file (a directory, or a parent that is a file); None if it can."""
    if path is None:
        return None
    path = Path(path)
    if path.is_dir():
        return f"{flag} {path} is a directory; give a file path, e.g. {path / example}"
    parent = next((p for p in path.parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return f"{flag} {path}: {parent} is a file, not a directory"
    return None
