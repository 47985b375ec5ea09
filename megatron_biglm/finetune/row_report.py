"""What happened to every row of a fine-tuning data set: kept, dropped (by reason), truncated.

Fine-tuning sets are small enough that one silently dropped row can move a score, so every
row is accounted for: `rows_seen == rows_kept + dropped` always holds, and truncation (a kept
row whose text was shortened to fit) is counted per field. Dropped rows reuse the readers'
`SkipReport` (reason -> count plus the first file:line locations; `strict=True` raises
`BadInputError` at the first one), so line-level problems (invalid JSON, unreadable files)
and row-level ones (missing field, empty target, over-long source) land in one report.
"""
from __future__ import annotations

from collections import Counter

from megatron_biglm.data.readers import UNMATCHED_PATTERN
from megatron_biglm.data.rows import INVALID_ROW, UNREADABLE_FILE, SkipReport  # noqa: F401  (a reason of rows)

# Row-level drop reasons (besides the readers' file/line reasons).
MISSING_FIELD = "missing_field"
EMPTY_FIELD = "empty_field"
EMPTY_TARGET = "empty_target"
BAD_LABEL = "bad_label"
UNLABELED = "unlabeled"
BAD_ANSWERS = "bad_answers"
SOURCE_TOO_LONG = "source_too_long"
ANSWER_NOT_IN_CONTEXT = "answer_not_in_context"
FILE_LEVEL = (UNREADABLE_FILE, UNMATCHED_PATTERN)


class RowReport(SkipReport):
    """A SkipReport that also counts rows seen/kept and per-field truncations."""

    def __init__(self, *, strict: bool = False, max_examples: int = 5):
        super().__init__(strict=strict, max_examples=max_examples)
        self.rows_seen = 0
        self.rows_kept = 0
        self.truncated: Counter[str] = Counter()

    @classmethod
    def all_kept(cls, rows: int) -> "RowReport":
        """The report of a source whose rows were checked elsewhere (a built instruction
        dataset, a BEIR folder's queries): `rows` seen and kept."""
        report = cls()
        report.rows_seen = report.rows_kept = int(rows)
        return report

    def skip_row(self, reason: str, source, line: int, detail: str = "") -> None:
        """A row the reader could not decode (invalid JSON, an undecodable byte, ...): seen and dropped."""
        self.rows_seen += 1
        self.skip(reason, source, line, detail)

    def drop_kept(self, reason: str, source, line: int = 0, detail: str = "") -> None:
        """A row the reader kept is dropped by a later stage (e.g. its source is too long)."""
        self.skip(reason, source, line, detail)
        self.rows_kept -= 1

    @property
    def rows_dropped(self) -> int:
        """Dropped rows; file-level skips (unreadable file, unmatched pattern) are not rows,
        so `rows_seen == rows_kept + rows_dropped` always holds."""
        return self.total - sum(self.counts[r] for r in FILE_LEVEL)

    def truncate(self, field: str, count: int = 1) -> None:
        """A kept row had `field` shortened to fit the length budget."""
        self.truncated[field] += count

    def as_dict(self) -> dict:
        return {"rows_seen": self.rows_seen, "rows_kept": self.rows_kept,
                "dropped": dict(sorted(self.counts.items())),
                "truncated": dict(sorted(self.truncated.items()))}

    def summary_line(self) -> str:
        dropped = super().summary_line().replace("skipped", "dropped", 1)
        truncated = ", ".join(f"{f} {n}" for f, n in sorted(self.truncated.items())) or "none"
        ignored = (f"; ignored {len(self.ignored)} file(s) of no data format in its directories "
                   f"({', '.join(self.ignored[:3])}{', ...' if len(self.ignored) > 3 else ''})" if self.ignored else "")
        return f"rows {self.rows_seen}: kept {self.rows_kept}, {dropped}; truncated: {truncated}{ignored}"

    def no_rows_lines(self) -> list[str]:
        """`file: why` for each file that gave no row (empty, a header only, no readable line)."""
        return [f"{path}: {why}" for path, why in self.no_rows.items()]
