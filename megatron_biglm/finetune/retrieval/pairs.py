"""Training pairs from jsonl: {"query": str, "positive": str, "negatives": [str, ...]?}.

Every row is accounted for in a `RowReport` (finetune/row_report.py): invalid JSON, a missing
or empty query/positive, negatives that are not a list of non-empty strings, or (when the
recipe uses k hard negatives) fewer than k of them, are dropped and counted by reason, never
silently. A file with no usable row is an error that says what a row must look like.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from megatron_biglm.data.rows import iter_rows
from megatron_biglm.finetune.row_report import EMPTY_FIELD, MISSING_FIELD, RowReport

BAD_NEGATIVES = "bad_negatives"
TOO_FEW_NEGATIVES = "too_few_negatives"
ROW_SHAPE = 'each line: {"query": "...", "positive": "...", "negatives": ["...", ...] (optional)}'


@dataclass(frozen=True)
class Pair:
    query: str
    positive: str
    negatives: tuple[str, ...] = ()


def read_pairs(paths, *, hard_negatives: int = 0, report: RowReport | None = None) -> tuple[list[Pair], RowReport]:
    """All usable pairs of the jsonl files `paths` (a path or a list), and the row report."""
    report = report if report is not None else RowReport()
    pairs: list[Pair] = []
    for path in [paths] if isinstance(paths, (str, bytes, os.PathLike)) else paths:
        for _, line, row in iter_rows(path, fmt="jsonl", skips=report):
            report.rows_seen += 1
            pair = _pair(row, hard_negatives, report, path, line)
            if pair is not None:
                report.rows_kept += 1
                pairs.append(pair)
    if not pairs:
        raise ValueError(f"no usable retrieval pair in {paths} ({report.summary_line()}); {ROW_SHAPE}")
    return pairs, report


def _pair(row, hard_negatives: int, report: RowReport, path, line: int) -> Pair | None:
    if not isinstance(row, dict):
        report.skip(MISSING_FIELD, path, line, f"a row is a JSON object, got {type(row).__name__}")
        return None
    for key in ("query", "positive"):
        if key not in row:
            report.skip(MISSING_FIELD, path, line, key)
            return None
        if not isinstance(row[key], str) or not row[key].strip():
            report.skip(EMPTY_FIELD, path, line, key)
            return None
    negatives = row.get("negatives", [])
    if not isinstance(negatives, list) or not all(isinstance(n, str) and n.strip() for n in negatives):
        report.skip(BAD_NEGATIVES, path, line, "negatives must be a list of non-empty strings")
        return None
    if len(negatives) < hard_negatives:
        report.skip(TOO_FEW_NEGATIVES, path, line, f"{len(negatives)} < {hard_negatives} hard negatives")
        return None
    return Pair(row["query"], row["positive"], tuple(negatives[:hard_negatives]))
