"""Instruction rows from FLAN / xP3-style jsonl or parquet, filtered as “Scaling Effects of Instruction Tuning” §3.1 does.

Two schemas are read (per row, whichever it has):
  * FLAN / xP3: `inputs` (the whole prompt) and `targets`;
  * Alpaca / natural_instructions (`experiments.bigbench_data.instruction_rows`): `instruction`, an
    optional `input`, and `output`.
Filters (“Scaling Effects of Instruction Tuning”: "only samples where the target consists of at most three tokens", "the
English split"): `languages` keeps rows whose `language` / `lang` field names one of them
(case-insensitive; `en` also keeps `en-US`); rows without such a field are kept and counted
as `no_language_field`. `max_target_tokens` (k) drops rows whose target tokenises to more
than k tokens. Every dropped row is counted by reason in the report (`RowReport`:
`rows_seen == rows_kept + dropped`), with its first file:line locations.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Sequence

from megatron_biglm.data.readers import NOT_AN_OBJECT

from ..data_files import file_objects
from ..row_report import EMPTY_FIELD, EMPTY_TARGET, MISSING_FIELD, RowReport

OTHER_LANGUAGE = "other_language"
TARGET_TOO_LONG = "target_too_long"
LANGUAGE_KEYS = ("language", "lang")


class InstructionReport(RowReport):
    """A RowReport that also counts kept rows with no language field (the filter could not apply)."""

    def __init__(self, *, strict: bool = False, max_examples: int = 5):
        super().__init__(strict=strict, max_examples=max_examples)
        self.notes: Counter[str] = Counter()

    def as_dict(self) -> dict:
        return {**super().as_dict(), "notes": dict(sorted(self.notes.items()))}

    def summary_line(self) -> str:
        notes = ", ".join(f"{k} {n}" for k, n in sorted(self.notes.items()))
        return super().summary_line() + (f"; notes: {notes}" if notes else "")


@dataclass(frozen=True)
class InstructionRow:
    instruction: str
    input: str
    target: str
    language: str | None
    source: str
    line: int


def _text(raw: dict, key: str):
    value = raw.get(key)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        value = value[0]  # several targets: the first
    return value


def parse_row(raw, source, line: int, report: InstructionReport) -> InstructionRow | None:
    """The row in one shape, or None after counting why it was dropped (rows_seen counted here)."""
    report.rows_seen += 1
    if not isinstance(raw, dict):
        report.skip(NOT_AN_OBJECT, source, line, f"row is a {type(raw).__name__}")
        return None
    if "inputs" in raw or "targets" in raw:
        keys = ("inputs", None, "targets")
    elif "instruction" in raw or "output" in raw:
        keys = ("instruction", "input", "output")
    else:
        report.skip(MISSING_FIELD, source, line, f"neither inputs/targets nor instruction/output "
                    f"(fields: {sorted(raw)[:8]})")
        return None
    prompt_key, input_key, target_key = keys
    prompt, target = _text(raw, prompt_key), _text(raw, target_key)
    extra = _text(raw, input_key) if input_key else ""
    for key, value in ((prompt_key, prompt), (target_key, target)):
        if value is None:
            report.skip(MISSING_FIELD, source, line, f"no field {key!r}")
            return None
        if not isinstance(value, str) or not value.strip():
            report.skip(EMPTY_TARGET if key == target_key else EMPTY_FIELD, source, line, f"field {key!r} is empty")
            return None
    if extra is not None and not isinstance(extra, str):
        report.skip(EMPTY_FIELD, source, line, f"field {input_key!r} is {type(extra).__name__}, not text")
        return None
    language = next((raw[k] for k in LANGUAGE_KEYS if isinstance(raw.get(k), str)), None)
    return InstructionRow(prompt, (extra or "").strip(), target, language, str(source), line)


def language_matches(language: str, wanted: Sequence[str]) -> bool:
    value = language.strip().lower()
    return any(value == w or value.split("-")[0].split("_")[0] == w for w in (x.lower() for x in wanted))


def read_instruction_rows(inputs, *, report: InstructionReport, languages: Sequence[str] | None = ("en",),
                          max_target_tokens: int | None = None, tokenizer=None) -> Iterator[tuple[InstructionRow, list[int]]]:
    """(row, target token ids) of every kept row, in file order; `tokenizer` is needed for
    the target ids (and so for `max_target_tokens`)."""
    if tokenizer is None:
        raise ValueError("read_instruction_rows needs the tokenizer (targets are stored as token ids)")
    for path, line, raw in file_objects(inputs, report, what="instruction data"):
        row = parse_row(raw, path, line, report)
        if row is None:
            continue
        if languages and row.language is not None:
            if not language_matches(row.language, languages):
                report.skip(OTHER_LANGUAGE, path, line, f"language {row.language!r} not in {list(languages)}")
                continue
        target_ids = list(tokenizer(row.target, add_special_tokens=False)["input_ids"])
        if max_target_tokens is not None and len(target_ids) > max_target_tokens:
            report.skip(TARGET_TOO_LONG, path, line, f"target has {len(target_ids)} tokens > {max_target_tokens}")
            continue
        report.rows_kept += 1
        if languages and row.language is None:
            report.notes["no_language_field"] += 1
        yield row, target_ids
