"""Documents out of jsonl / plain-text / parquet files (optionally .gz or .zst), with every
bad input counted instead of crashing or vanishing.

Corpora scraped at scale always hold some broken lines; a tool that dies on line 9,000,001
wastes the run, and one that drops lines silently hides data loss. So each reader yields
good `Record`s and reports every skipped line to a `SkipReport` (reason -> count, plus the
first few `file:line` locations). `strict=True` turns the first skip into `BadInputError`.
jsonl and parquet are read by the one row reader (`rows.py`) with the corpus policy: a file
that cannot be read to its end keeps the documents before it and is reported as one loss,
`unreadable_file: truncated after line N`.

Document conventions (what the tokenizer sees):
  * jsonl: the value of each key, exactly as decoded (no stripping).
  * text, `text_mode="block"`: a run of lines ended by a blank (whitespace-only) line; the
    newline that ends its last line is dropped. `text_mode="file"`: the whole file, minus
    trailing newlines.
  * parquet: the string (or UTF-8 binary) column named by each key.
A document that is empty or whitespace only is skipped as `empty_document`. Location
numbers are 1-based lines (jsonl, text; a block's first line) or rows (parquet); 0 = file.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .rows import (
    INVALID_UTF8,
    SKIP,
    BadInputError,  # noqa: F401  (the error of every reader; strict mode raises it)
    Position,
    SkipReport,
    format_by_suffix,
    iter_rows,
    open_binary,
    read_to_end,
)

# Skip reasons (the keys of SkipReport.counts), besides the row reader's.
NOT_AN_OBJECT = "not_an_object"
MISSING_KEY = "missing_key"
NOT_A_STRING = "not_a_string"
EMPTY_DOCUMENT = "empty_document"
UNMATCHED_PATTERN = "unmatched_pattern"

FORMATS = ("jsonl", "text", "parquet")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".pq": "parquet", ".txt": "text", ".text": "text", ".md": "text"}


@dataclass(frozen=True)
class Record:
    """One input record: its location and the valid text of each requested key."""
    source: str
    line: int
    texts: dict[str, str]


def input_format(path, requested: str = "auto") -> str:
    """'jsonl', 'text' or 'parquet', from `requested` or the file name (compression suffix
    ignored); unknown names are a usage error, never a guess."""
    if requested != "auto":
        if requested not in FORMATS:
            raise ValueError(f"unknown input format {requested!r}; use one of {FORMATS} or 'auto'")
        return requested
    return format_by_suffix(path, _SUFFIX_FORMAT, "cannot tell the format of {path} from its name: use a "
                            "suffix in {suffixes} (optionally + .gz/.zst), or pass the format explicitly "
                            "(--input-format)")


def expand_inputs(inputs: Iterable, report: SkipReport, formats: dict | None = None) -> list[Path]:
    """Paths, globs (`**` recursive) and directories -> sorted, de-duplicated file list.
    A directory lists the files of every format in `formats` (extension -> format, as
    `input_format`'s table; default: the corpus formats), plain, .gz or .zst; its other files are
    left out and named in `report.ignored`. A pattern or directory with no matching files is
    reported as `unmatched_pattern`; a literal path is kept even if missing, so reading it
    reports `unreadable_file`."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files: list[Path] = []
    seen: set[str] = set()
    for item in inputs:
        item = str(item)
        if glob.has_magic(item):
            matches = [Path(m) for m in sorted(glob.glob(item, recursive=True)) if os.path.isfile(m)]
        elif os.path.isdir(item):
            listed = [p for p in sorted(Path(item).rglob("*")) if p.is_file()]
            matches = [p for p in listed if _has_known_suffix(p, formats or _SUFFIX_FORMAT)]
            report.ignored.extend(str(p) for p in listed if p not in matches)
        else:
            matches = [Path(item)]
        if not matches:
            kinds = sorted(set((formats or _SUFFIX_FORMAT).values()))
            report.skip(UNMATCHED_PATTERN, item, 0, "matched no input files" + (
                f" (a directory is read for {', '.join(kinds)} files, plain, .gz or .zst)"
                if os.path.isdir(item) else ""))
        for path in matches:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                files.append(path)
    return files


def _has_known_suffix(path: Path, formats: dict) -> bool:
    try:
        format_by_suffix(path, formats, "")
        return True
    except ValueError:
        return False


def iter_records(inputs, *, json_keys: Sequence[str] = ("text",), report: SkipReport,
                 text_mode: str = "block", input_format_name: str = "auto") -> Iterator[Record]:
    """Yield the good records of all inputs (paths, globs, dirs) in order; count everything
    else in `report`."""
    yield from records_from_files(expand_inputs(inputs, report), json_keys=json_keys,
                                  report=report, text_mode=text_mode,
                                  input_format_name=input_format_name)


def records_from_files(files: Sequence[Path], *, json_keys: Sequence[str] = ("text",),
                       report: SkipReport, text_mode: str = "block",
                       input_format_name: str = "auto") -> Iterator[Record]:
    """`iter_records` over an already expanded file list (see `expand_inputs`)."""
    json_keys = tuple(json_keys)
    if not json_keys:
        raise ValueError("json_keys is empty: name at least one key, e.g. ('text',)")
    if text_mode not in ("block", "file"):
        raise ValueError(f"text_mode must be 'block' or 'file', got {text_mode!r}")
    formats = [input_format(path, input_format_name) for path in files]
    if len(json_keys) > 1 and "text" in formats:
        raise ValueError(f"plain-text inputs hold one field, but {len(json_keys)} keys were "
                         f"requested ({', '.join(json_keys)}); process them separately")
    for path, fmt in zip(files, formats):
        if fmt == "text":
            yield from read_to_end(path, _text_records(path, json_keys[0], report, text_mode), skips=report,
                                   on_unreadable=SKIP)
            continue
        rows = iter_rows(path, fmt=fmt, skips=report, on_unreadable=SKIP,
                         columns=json_keys if fmt == "parquet" else None)
        for row in rows:
            record = _record(row, json_keys, report, fmt)
            if record is not None:
                yield record


def iter_texts(inputs, *, json_keys: Sequence[str] = ("text",), report: SkipReport,
               text_mode: str = "block", input_format_name: str = "auto") -> Iterator[str]:
    """Every good document text (all keys), e.g. to train a tokenizer."""
    for record in iter_records(inputs, json_keys=json_keys, report=report, text_mode=text_mode,
                               input_format_name=input_format_name):
        yield from record.texts.values()


def _check_text(value, key: str, source, line: int, report: SkipReport) -> str | None:
    """The text if `value` is a usable document, else None (after reporting why)."""
    if value is None:
        report.skip_row(MISSING_KEY, source, line, f"key {key!r} is null")
        return None
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            report.skip_row(INVALID_UTF8, source, line, f"key {key!r}: {exc.reason} at byte {exc.start}")
            return None
    if not isinstance(value, str):
        report.skip_row(NOT_A_STRING, source, line, f"key {key!r} is {type(value).__name__}")
        return None
    if not value or value.isspace():
        report.skip_row(EMPTY_DOCUMENT, source, line, f"key {key!r} is empty or whitespace")
        return None
    return value


def _record(row, keys: tuple[str, ...], report: SkipReport, fmt: str) -> Record | None:
    """The record of a jsonl or parquet row: the valid text of each key it has (each key it
    lacks, or holds no text in, is reported)."""
    source, number, obj = row
    if not isinstance(obj, dict):
        report.skip_row(NOT_AN_OBJECT, source, number, f"line is a JSON {type(obj).__name__}")
        return None
    texts = {}
    for key in keys:
        if key not in obj:
            found = "column" if fmt == "parquet" else "key"
            report.skip_row(MISSING_KEY, source, number, f"no {found} {key!r} ({found}s: {sorted(obj)[:8]})")
            continue
        text = _check_text(obj[key], key, source, number, report)
        if text is not None:
            texts[key] = text
    return Record(source, number, texts) if texts else None


def _text_records(path, key: str, report: SkipReport, text_mode: str):
    def read(position: Position) -> Iterator[Record]:
        with open_binary(path) as fh:
            if text_mode == "file":
                data = fh.read()
                position.line = 1
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as exc:
                    line = data[: exc.start].count(b"\n") + 1
                    report.skip(INVALID_UTF8, path, line, f"{exc.reason} at byte {exc.start}")
                    return
                text = text.rstrip("\r\n")
                if not text.strip():
                    report.skip(EMPTY_DOCUMENT, path, 1, "file is empty or whitespace")
                    return
                yield Record(str(path), 1, {key: text})
                return
            yield from _blocks(fh, path, key, report, position)
    return read


def _blocks(fh, path, key: str, report: SkipReport, position: Position) -> Iterator[Record]:
    block: list[str] = []
    start, bad = 0, None
    for number, raw in enumerate(fh, start=1):
        position.line = number
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad = bad or (number, f"{exc.reason} at byte {exc.start} of the line")
            start = start or number
            block.append("")
            continue
        if line.strip():
            start = start or number
            block.append(line)
            continue
        if block:
            record = _finish_block(block, start, bad, path, key, report)
            if record:
                yield record
        block, start, bad = [], 0, None
    if block:
        record = _finish_block(block, start, bad, path, key, report)
        if record:
            yield record


def _finish_block(block, start, bad, path, key, report) -> Record | None:
    if bad:
        report.skip(INVALID_UTF8, path, bad[0], bad[1] + f" (block starting at line {start} skipped)")
        return None
    text = "".join(block)
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    return Record(str(path), start, {key: text})
