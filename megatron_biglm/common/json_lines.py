"""Strict JSON-lines reading for user-given inputs (prompts, Genset pairs, BEIR files): every
non-blank line must be JSON, and a bad line stops the run with `file:line` and what to write
instead (the fine-tuning data path, which counts and reports bad rows, is `finetune/data_files`).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator


def json_lines(path, error: type[Exception], hint: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line of `path`; `error(message)` is
    raised for a line that is not JSON, the message ending with `hint`."""
    path = Path(path)
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number} is not JSON ({exc.msg}); {hint}") from None
