"""Documents out of jsonl / plain-text / parquet files (optionally .gz or .zst), with every
bad input counted instead of crashing or vanishing.

Corpora scraped at scale always hold some broken lines; a tool that dies on line 9,000,001
wastes the run, and one that drops lines silently hides data loss. So each reader yields
good `Record`s and reports every skipped line to a `SkipReport` (reason -> count, plus the
first few `file:line` locations). `strict=True` turns the first skip into `BadInputError`.

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
import gzip
import io
import json
import os
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Sequence

# Skip reasons (the keys of SkipReport.counts).
INVALID_JSON = "invalid_json"
NOT_AN_OBJECT = "not_an_object"
MISSING_KEY = "missing_key"
NOT_A_STRING = "not_a_string"
EMPTY_DOCUMENT = "empty_document"
INVALID_UTF8 = "invalid_utf8"
LONE_SURROGATE = "lone_surrogate"
BLANK_LINE = "blank_line"
UNREADABLE_FILE = "unreadable_file"
UNMATCHED_PATTERN = "unmatched_pattern"

FORMATS = ("jsonl", "text", "parquet")
_SUFFIX_FORMAT = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".pq": "parquet", ".txt": "text", ".text": "text", ".md": "text"}
_COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
_SURROGATE = re.compile("[\ud800-\udfff]")


class BadInputError(ValueError):
    """Raised in strict mode at the first bad input; the message starts with file:line."""


class SkipReport:
    """Counts skipped inputs by reason and keeps the first `max_examples` locations of each.

    Also counts files opened and files that could not be read, so callers can tell "some
    lines were bad" from "nothing was readable at all"."""

    def __init__(self, *, strict: bool = False, max_examples: int = 5):
        self.strict = strict
        self.max_examples = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.files_seen = 0
        self.files_failed = 0

    def skip(self, reason: str, source, line: int = 0, detail: str = "", count: int = 1) -> None:
        where = f"{source}:{line}" if line else str(source)
        message = f"{where}: {reason}" + (f": {detail}" if detail else "")
        if self.strict:
            raise BadInputError(message + " (strict mode: fix the input, or drop --strict "
                                          "to skip and count bad inputs)")
        self.counts[reason] += count
        shown = self.examples.setdefault(reason, [])
        if len(shown) < self.max_examples:
            shown.append(message)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))

    def summary_line(self) -> str:
        if not self.counts:
            return "skipped 0"
        parts = ", ".join(f"{reason} {n}" for reason, n in sorted(self.counts.items()))
        return f"skipped {self.total} ({parts})"

    def example_lines(self) -> list[str]:
        return [example for reason in sorted(self.examples) for example in self.examples[reason]]


@dataclass(frozen=True)
class Record:
    """One input record: its location and the valid text of each requested key."""
    source: str
    line: int
    texts: dict[str, str]


def format_by_suffix(path, table: dict, unknown: str) -> str:
    """The format `table` maps the file's extension to (a .gz/.zst(d) suffix ignored); else a
    ValueError with `unknown` formatted with {path} and {suffixes}."""
    name = str(path).lower()
    for suffix in _COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    fmt = table.get(os.path.splitext(name)[1])
    if fmt is None:
        raise ValueError(unknown.format(path=path, suffixes=sorted(table)))
    return fmt


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


def expand_inputs(inputs: Iterable, report: SkipReport) -> list[Path]:
    """Paths, globs (`**` recursive) and directories -> sorted, de-duplicated file list.
    A pattern or directory with no matching files is reported as `unmatched_pattern`; a
    literal path is kept even if missing, so reading it reports `unreadable_file`."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    files: list[Path] = []
    seen: set[str] = set()
    for item in inputs:
        item = str(item)
        if glob.has_magic(item):
            matches = [Path(m) for m in sorted(glob.glob(item, recursive=True)) if os.path.isfile(m)]
        elif os.path.isdir(item):
            matches = [p for p in sorted(Path(item).rglob("*"))
                       if p.is_file() and _has_known_suffix(p)]
        else:
            matches = [Path(item)]
        if not matches:
            report.skip(UNMATCHED_PATTERN, item, 0, "matched no input files")
        for path in matches:
            key = os.path.realpath(path)
            if key not in seen:
                seen.add(key)
                files.append(path)
    return files


def _has_known_suffix(path: Path) -> bool:
    try:
        input_format(path)
        return True
    except ValueError:
        return False


def open_binary(path) -> BinaryIO:
    """Open a file for binary reading, decompressing .gz / .zst(d) transparently."""
    name = str(path).lower()
    if name.endswith(".gz"):
        return gzip.open(path, "rb")
    if name.endswith((".zst", ".zstd")):
        return io.BufferedReader(_ZstdFrames(open(path, "rb")), buffer_size=1 << 20)
    return open(path, "rb")


class _ZstdFrames(io.RawIOBase):
    """Decompressed bytes of a (multi-frame) zstd file that raises EOFError when the file
    ends inside a frame. zstandard's `stream_reader` returns a clean EOF there, which would
    drop the tail of a truncated file without a word."""

    def __init__(self, raw: BinaryIO):
        import zstandard

        self._raw = raw
        self._context = zstandard.ZstdDecompressor()
        self._chunks = self._decompress()
        self._pending = memoryview(b"")

    def _decompress(self) -> Iterator[bytes]:
        frame, in_frame = self._context.decompressobj(), False
        while chunk := self._raw.read(1 << 20):
            while chunk:
                out = frame.decompress(chunk)
                in_frame = True
                if out:
                    yield out
                if not frame.eof:
                    break
                chunk = frame.unused_data
                frame, in_frame = self._context.decompressobj(), False
        if in_frame:
            raise EOFError("zstd file ends inside a frame (truncated)")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            chunk = next(self._chunks, b"")
            if not chunk:
                return 0
            self._pending = memoryview(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


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
        report.files_seen += 1
        reader = {"jsonl": _jsonl_records, "parquet": _parquet_records}.get(fmt)
        records = reader(path, json_keys, report) if reader else _text_records(
            path, json_keys[0], report, text_mode)
        yield from _guard_io(path, records, report)


def iter_texts(inputs, *, json_keys: Sequence[str] = ("text",), report: SkipReport,
               text_mode: str = "block", input_format_name: str = "auto") -> Iterator[str]:
    """Every good document text (all keys), e.g. to train a tokenizer."""
    for record in iter_records(inputs, json_keys=json_keys, report=report, text_mode=text_mode,
                               input_format_name=input_format_name):
        yield from record.texts.values()


class _Position:
    """The line a reader is at, shared with `_guard_io` to locate read errors."""
    __slots__ = ("line",)

    def __init__(self):
        self.line = 0


def _guard_io(path, records, report: SkipReport) -> Iterator[Record]:
    """Run one file's reader; an I/O or decompression error ends that file (keeping what
    was read) and is reported as `unreadable_file` at the line where it happened."""
    position = _Position()
    try:
        yield from records(position)
    except (OSError, EOFError, zlib.error) + _extra_io_errors() as exc:
        report.files_failed += 1
        line = position.line + 1 if position.line else 0
        report.skip(UNREADABLE_FILE, path, line, f"{type(exc).__name__}: {exc}")


def _extra_io_errors() -> tuple[type, ...]:
    errors: list[type] = []
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a dependency
        pass
    try:
        import pyarrow
        errors.append(pyarrow.ArrowException)
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    return tuple(errors)


def _check_text(value, key: str, source, line: int, report: SkipReport,
                may_hold_surrogates: bool = False) -> str | None:
    """The text if `value` is a usable document, else None (after reporting why). Only JSON
    `\\u` escapes can smuggle in unpaired surrogates (strict UTF-8 decoding rejects them),
    and the Rust tokenizer cannot take them."""
    if value is None:
        report.skip(MISSING_KEY, source, line, f"key {key!r} is null")
        return None
    if isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            report.skip(INVALID_UTF8, source, line, f"key {key!r}: {exc.reason} at byte {exc.start}")
            return None
    if not isinstance(value, str):
        report.skip(NOT_A_STRING, source, line, f"key {key!r} is {type(value).__name__}")
        return None
    if not value or value.isspace():
        report.skip(EMPTY_DOCUMENT, source, line, f"key {key!r} is empty or whitespace")
        return None
    if may_hold_surrogates and _SURROGATE.search(value):
        report.skip(LONE_SURROGATE, source, line, f"key {key!r} holds an unpaired \\ud800-\\udfff escape")
        return None
    return value


def _jsonl_records(path, keys: tuple[str, ...], report: SkipReport):
    def read(position: _Position) -> Iterator[Record]:
        with open_binary(path) as fh:
            for number, raw in enumerate(fh, start=1):
                position.line = number
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    report.skip(INVALID_UTF8, path, number, f"{exc.reason} at byte {exc.start}")
                    continue
                if not line.strip():
                    report.skip(BLANK_LINE, path, number)
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    report.skip(INVALID_JSON, path, number, exc.msg + f" (column {exc.colno})")
                    continue
                if not isinstance(obj, dict):
                    report.skip(NOT_AN_OBJECT, path, number, f"line is a JSON {type(obj).__name__}")
                    continue
                texts = {}
                for key in keys:
                    if key not in obj:
                        report.skip(MISSING_KEY, path, number, f"no key {key!r} (keys: {sorted(obj)[:8]})")
                        continue
                    text = _check_text(obj[key], key, path, number, report, b"\\u" in raw)
                    if text is not None:
                        texts[key] = text
                if texts:
                    yield Record(str(path), number, texts)
    return read


def _text_records(path, key: str, report: SkipReport, text_mode: str):
    def read(position: _Position) -> Iterator[Record]:
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


def _blocks(fh, path, key: str, report: SkipReport, position: _Position) -> Iterator[Record]:
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


def _parquet_records(path, keys: tuple[str, ...], report: SkipReport):
    def read(position: _Position) -> Iterator[Record]:
        import pyarrow.parquet as pq

        name = str(path).lower()
        if name.endswith(_COMPRESSION_SUFFIXES):
            with open_binary(path) as fh:
                source = io.BytesIO(fh.read())
        else:
            source = str(path)
        parquet = pq.ParquetFile(source)
        columns = parquet.schema_arrow.names
        present = [k for k in keys if k in columns]
        for key in keys:
            if key not in present and parquet.metadata.num_rows:
                report.skip(MISSING_KEY, path, 1, f"no column {key!r} (columns: {columns[:8]}); "
                            f"all {parquet.metadata.num_rows} rows", count=parquet.metadata.num_rows)
        if not present:
            return
        row = 0
        for batch in parquet.iter_batches(batch_size=1024, columns=present):
            values = {k: batch.column(k).to_pylist() for k in present}
            for i in range(batch.num_rows):
                row += 1
                position.line = row
                texts = {}
                for key in present:
                    text = _check_text(values[key][i], key, path, row, report)
                    if text is not None:
                        texts[key] = text
                if texts:
                    yield Record(str(path), row, texts)
    return read
