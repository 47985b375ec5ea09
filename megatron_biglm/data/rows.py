"""The one reader of users' row files: jsonl, csv, tsv and parquet, plain or .gz / .zst.

Every consumer of a row file (fine-tuning, retrieval and zero-shot task data, prompts,
pretraining corpora) reads it through `iter_rows`, so a bad line is reported the same way
everywhere: `file:line: reason: detail` in one `SkipReport`. `iter_rows` yields a `Row` for
each row it can decode and reports the rest as skipped rows: an undecodable byte
(`invalid_utf8`, in every format; in jsonl also a `\\ud800`-`\\udfff` escape with no pair,
`lone_surrogate`, which no tokenizer can take), a line that is not JSON, a blank line, a
csv row with more cells than its header. What a row must hold is the caller's check.

A file that cannot be read to its end (a truncated .gz or .zst, a corrupt parquet file, a
missing file) is the caller's policy, stated as `on_unreadable`:
  STOP  raise `BadInputError` naming the file and the last line read, and the caller's
        `opt_in` that would skip instead (fine-tuning and retrieval data: training or scoring
        on part of a file without a word changes the result);
  SKIP  keep the rows before it and report the rest of the file as one loss,
        `unreadable_file: truncated after line N` (pretraining corpora, whose `--strict`
        makes the report raise instead).

Numbers are 1-based: file lines (a csv row spanning lines has its first line's number),
parquet rows. A UTF-8 byte-order mark is accepted at the start of every text format. The
first row of a csv/tsv file is its header; a row has its cells under the header's names
(cells it lacks are None).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import zlib
from collections import Counter
from typing import BinaryIO, Iterator, NamedTuple

import pyarrow
import pyarrow.parquet as pq
import zstandard

# Skip reasons of a row (the keys of SkipReport.counts), and of a file.
INVALID_UTF8 = "invalid_utf8"
INVALID_JSON = "invalid_json"
BLANK_LINE = "blank_line"
INVALID_ROW = "invalid_row"
LONE_SURROGATE = "lone_surrogate"
UNREADABLE_FILE = "unreadable_file"

STOP, SKIP = "stop", "skip"
#: the row formats by extension (after a .gz / .zst / .zstd suffix)
ROW_FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv",
               ".parquet": "parquet", ".pq": "parquet"}
COMPRESSION_SUFFIXES = (".gz", ".zst", ".zstd")
_BOM = b"\xef\xbb\xbf"


class BadInputError(ValueError):
    """A user's input file cannot be used as it is; the message starts with `file:line` and
    says what to do (strict mode's first bad row, a file that cannot be read to its end)."""


class SkipReport:
    """Counts skipped inputs by reason and keeps the first `max_examples` `file:line: reason`
    locations of each; `strict=True` raises `BadInputError` at the first one instead.

    Also counts files opened and files that could not be read to their end, so callers can
    tell "some lines were bad" from "nothing was readable at all". `skip_row` is a skipped
    row (a kind of report may count rows); `skip` any other skipped input."""

    def __init__(self, *, strict: bool = False, max_examples: int = 5):
        self.strict = strict
        self.max_examples = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.files_seen = 0
        self.files_failed = 0
        self.no_rows: dict[str, str] = {}  # a file read to its end without one row -> why (`why_no_rows`)
        self.ignored: list[str] = []  # files a directory holds in no format its reader reads

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

    def skip_row(self, reason: str, source, line: int, detail: str = "") -> None:
        """A row of a file was skipped (by the reader or the caller's check)."""
        self.skip(reason, source, line, detail)

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


class Row(NamedTuple):
    """One decoded row: its file, its 1-based line (or parquet row) and its value (any JSON
    value for jsonl; {column: value} for csv, tsv and parquet)."""
    source: str
    line: int
    value: object


def format_by_suffix(path, table: dict, unknown: str) -> str:
    """The format `table` maps the file's extension to (a .gz/.zst(d) suffix ignored); else a
    ValueError (a usage error: the name says no format) with `unknown` formatted with {path}
    and {suffixes}."""
    name = str(path).lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    fmt = table.get(os.path.splitext(name)[1])
    if fmt is None:
        raise ValueError(unknown.format(path=path, suffixes=sorted(table)))
    return fmt


def row_format(path) -> str:
    """jsonl, csv, tsv or parquet from the file's extension (see ROW_FORMATS)."""
    return format_by_suffix(path, ROW_FORMATS, "{path}: cannot tell a row file's format from its name: use an "
                            "extension in {suffixes} (optionally + .gz/.zst), and rename the file to its "
                            "format's extension")


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


def read_errors() -> tuple[type, ...]:
    """The exceptions that mean a file cannot be read (on), as opposed to a bad row."""
    errors: list[type] = [OSError, EOFError, zlib.error]
    try:
        errors.append(zstandard.ZstdError)
    except ImportError:  # pragma: no cover - zstandard is a dependency
        pass
    try:
        errors.append(pyarrow.ArrowException)
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        pass
    return tuple(errors)


class Position:
    """The last line a reader has read whole, to say where an unreadable file ended."""
    __slots__ = ("line", "header")

    def __init__(self):
        self.line = 0
        self.header = None  # a csv/tsv file's column names, once read


def iter_rows(path, *, fmt: str | None = None, skips: SkipReport, on_unreadable: str = STOP,
              opt_in: str = "", columns=None) -> Iterator[Row]:
    """The rows of one file in order (see the module doc); `fmt` is jsonl, csv, tsv or parquet
    (default: from the extension). `opt_in` names the caller's setting that skips an
    unreadable file (said in the STOP error); `columns` limits a parquet file to those of
    them it has (the others are not read)."""
    if on_unreadable not in (STOP, SKIP):
        raise ValueError(f"on_unreadable must be {STOP!r} or {SKIP!r}, got {on_unreadable!r}")
    fmt = fmt or row_format(path)
    readers = {"jsonl": _jsonl_rows, "csv": _delimited_rows, "tsv": _delimited_rows, "parquet": _parquet_rows}
    if fmt not in readers:
        raise ValueError(f"unknown row format {fmt!r}; use one of {sorted(readers)}")
    before, failed, rows = Counter(skips.counts), skips.files_failed, 0
    position = Position()

    def read(at: Position) -> Iterator[Row]:
        at.header = None
        yield from readers[fmt](path, fmt, skips, at, columns)
        position.line, position.header = at.line, at.header

    for row in read_to_end(path, read, skips=skips, on_unreadable=on_unreadable, opt_in=opt_in):
        rows += 1
        yield row
    if not rows and skips.files_failed == failed:
        skips.no_rows[str(path)] = why_no_rows(position, skips.counts - before, fmt)


def why_no_rows(position: "Position", skipped: Counter, fmt: str) -> str:
    """Why a file read to its end gave no row: it is empty, holds only a csv/tsv header or
    only blank lines, or none of its lines could be read (the counts by reason)."""
    if not position.line:
        return "the file holds no rows" if fmt == "parquet" else "the file is empty (no lines)"
    if not skipped:
        columns = ", ".join(position.header or ())
        return f"the file holds only a header ({columns}) and no rows" if position.header is not None else "no rows"
    if set(skipped) == {BLANK_LINE}:
        return f"the file holds only blank lines ({skipped[BLANK_LINE]})"
    counts = ", ".join(f"{reason} {n}" for reason, n in sorted(skipped.items()))
    hint = ("; the file is not UTF-8 (latin-1 or cp1252?): save it as UTF-8"
            if skipped[INVALID_UTF8] >= max(skipped.values()) else "")
    return f"no row could be read ({counts}){hint}"


def read_to_end(path, read, *, skips: SkipReport, on_unreadable: str = STOP, opt_in: str = "") -> Iterator:
    """What `read(position)` yields from one file; a read error (see `read_errors`) is handled
    by `on_unreadable` (see the module doc), at the line `position` last held."""
    skips.files_seen += 1
    position = Position()
    try:
        yield from read(position)
    except read_errors() as exc:
        _unreadable(path, position.line, exc, skips, on_unreadable, opt_in)
    except _NotRows as exc:
        if on_unreadable == STOP:
            raise BadInputError(str(exc)) from None
        skips.files_failed += 1
        skips.skip(UNREADABLE_FILE, path, 0, str(exc))


class _NotRows(Exception):
    """The whole file is in another format than its name says (e.g. a JSON array as .jsonl)."""


def _unreadable(path, line: int, exc: Exception, skips: SkipReport, on_unreadable: str, opt_in: str) -> None:
    if isinstance(exc, FileNotFoundError):
        loss = "does not exist"
    elif isinstance(exc, EOFError):
        loss = f"truncated after line {line}" if line else "truncated before its first line"
    else:
        loss = f"unreadable after line {line}" if line else "unreadable"
    detail = f"{loss} ({type(exc).__name__}: {exc})"
    where = f"{path}:{line + 1}" if line else str(path)
    if on_unreadable == STOP and isinstance(exc, FileNotFoundError):
        raise BadInputError(f"{path}: {UNREADABLE_FILE}: {loss}: give an existing file (working directory "
                            f"{os.getcwd()})") from None
    if on_unreadable == STOP:
        skip = f", or set {opt_in} to keep the rows before it (the rest counts as one loss)" if opt_in else ""
        raise BadInputError(f"{where}: {UNREADABLE_FILE}: {detail}: the file cannot be read to its end; "
                            f"repair or re-create it{skip}") from None
    skips.files_failed += 1
    skips.skip(UNREADABLE_FILE, path, line + 1 if line else 0, detail)


def _lines(fh, position: Position) -> Iterator[tuple[int, bytes]]:
    """(number, bytes) of each line, a leading byte-order mark removed."""
    for number, raw in enumerate(fh, start=1):
        if number == 1 and raw.startswith(_BOM):
            raw = raw[len(_BOM):]
        position.line = number
        yield number, raw


def _decode(raw: bytes) -> tuple[str | None, str]:
    """(text, "") or (None, why it is not UTF-8)."""
    try:
        return raw.decode("utf-8"), ""
    except UnicodeDecodeError as exc:
        return None, f"{exc.reason} at byte {exc.start} of the line"


def _jsonl_rows(path, fmt, skips: SkipReport, position: Position, columns) -> Iterator[Row]:  # noqa: ARG001
    source = str(path)
    with open_binary(path) as fh:
        for number, raw in _lines(fh, position):
            if number == 1 and raw.lstrip().startswith(b"["):
                raise _NotRows(
                    f"{path} is a JSON array; JSON Lines holds one JSON object per line (e.g. python -c \"import "
                    "json,sys; [print(json.dumps(r)) for r in json.load(open(sys.argv[1]))]\" data.json > data.jsonl)")
            text, why = _decode(raw)
            if text is None:
                skips.skip_row(INVALID_UTF8, source, number, why)
                continue
            if not text.strip():
                skips.skip_row(BLANK_LINE, source, number)
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                skips.skip_row(INVALID_JSON, source, number, f"{exc.msg} (column {exc.colno})")
                continue
            except (ValueError, RecursionError) as exc:  # an integer of > 4300 digits, deep nesting
                skips.skip_row(INVALID_JSON, source, number, f"{type(exc).__name__}: {exc}"[:200])
                continue
            if b"\\u" in raw and _has_surrogate(value):
                skips.skip_row(LONE_SURROGATE, source, number, "a \\ud800-\\udfff escape with no pair (not a "
                               "character)")
                continue
            yield Row(source, number, value)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_surrogate(value) -> bool:
    if isinstance(value, str):
        return bool(_SURROGATE.search(value))
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(map(_has_surrogate, value))
    return False


def _delimited_rows(path, fmt, skips: SkipReport, position: Position, columns) -> Iterator[Row]:  # noqa: ARG001
    """csv (comma) or tsv (tab). Lines are decoded one by one, so a byte that is not UTF-8
    drops the row holding it (invalid_utf8 at its line), as in jsonl."""
    source = str(path)
    bad: dict[int, str] = {}

    pending: list[str] = []  # the lines of the row being read

    def decoded(fh) -> Iterator[str]:
        for number, raw in _lines(fh, position):
            text, why = _decode(raw)
            if text is None:
                bad[number] = why
                text = raw.decode("utf-8", "replace")
            pending.append(text)
            yield text

    with open_binary(path) as fh:
        reader = csv.reader(decoded(fh), delimiter="\t" if fmt == "tsv" else ",")
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise BadInputError(f"{path}:1: the header is not {fmt} ({exc}); write the column names on the "
                                "first line") from None
        if any(n <= reader.line_num for n in bad):
            line = min(bad)
            raise BadInputError(f"{path}:{line}: {INVALID_UTF8} in the header ({bad[line]}); save the file as "
                                "UTF-8")
        position.header = tuple(header)
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise BadInputError(f"{path}:1: the header names the column(s) {repeated} more than once; give every "
                                "column its own name")
        start = reader.line_num + 1
        pending.clear()
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:
                skips.skip_row(INVALID_ROW, source, start, str(exc))
                start = reader.line_num + 1
                pending.clear()
                continue
            first, start = start, reader.line_num + 1
            lines, pending[:] = pending[:], []
            if len(lines) > 1:
                _check_quotes(path, first, lines)
            undecodable = [n for n in range(first, start) if n in bad]
            if undecodable:
                skips.skip_row(INVALID_UTF8, source, undecodable[0], bad[undecodable[0]])
                continue
            if not any(cell.strip() for cell in cells):
                skips.skip_row(BLANK_LINE, source, first)
                continue
            if len(cells) > len(header):
                skips.skip_row(INVALID_ROW, source, first, f"{len(cells)} cells under a header of {len(header)} "
                               f"({', '.join(header)})")
                continue
            yield Row(source, first, {name: cells[i] if i < len(cells) else None for i, name in enumerate(header)})


#: how far one csv/tsv row may run over lines (or bytes) before its open quote is taken for an
#: unbalanced one: far beyond a cell of prose, well short of a file swallowed into one cell
MAX_ROW_LINES = 1000
MAX_ROW_BYTES = 1 << 20


def _check_quotes(path, first: int, lines: list[str]) -> None:
    """A row over several lines is a quoted cell holding line breaks. Its quotes are balanced
    (a quote inside a quoted cell is written twice); an odd number of them is an unbalanced
    quote that swallowed the lines after it, to the next quote or the end of the file. So is
    a row longer than the bounds. Either raises BadInputError at the row's first line."""
    size = sum(len(line.encode("utf-8", "replace")) for line in lines)
    quotes = sum(line.count('"') for line in lines)
    if quotes % 2 == 0 and len(lines) <= MAX_ROW_LINES and size <= MAX_ROW_BYTES:
        return
    how = (f"runs over {len(lines)} lines to line {first + len(lines) - 1} with {quotes} quote(s)" if quotes % 2
           else f"runs over {len(lines)} lines ({size:,} bytes; at most {MAX_ROW_LINES} lines or "
                f"{MAX_ROW_BYTES:,} bytes)")
    raise BadInputError(f"{path}:{first}: {INVALID_ROW}: an unbalanced quote: the quoted cell opened on line {first} "
                        f"{how}, taking the rows after it into one cell; close the quote, or write a quote inside "
                        'a cell as "" (and quote that cell)')


def _parquet_rows(path, fmt, skips: SkipReport, position: Position, columns) -> Iterator[Row]:  # noqa: ARG001
    """Rows as {column: value}; a binary cell is decoded as UTF-8 (a row holding one that is
    not is invalid_utf8, as in the text formats)."""
    source = str(path)
    if str(path).lower().endswith(COMPRESSION_SUFFIXES):
        with open_binary(path) as fh:
            data = io.BytesIO(fh.read())
    else:
        data = str(path)
    parquet = pq.ParquetFile(data)
    wanted = None if columns is None else [c for c in columns if c in parquet.schema_arrow.names] or None
    number = 0
    for batch in parquet.iter_batches(batch_size=1024, columns=wanted):
        for value in batch.to_pylist():
            number += 1
            try:
                value = _text_cells(value)
            except UnicodeDecodeError as exc:
                skips.skip_row(INVALID_UTF8, source, number, f"a binary cell: {exc.reason} at byte {exc.start}")
                continue
            finally:
                position.line = number
            yield Row(source, number, value)


def _text_cells(value):
    """`value` with every bytes object in it decoded as UTF-8 (UnicodeDecodeError if one is not)."""
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8")
    if isinstance(value, dict):
        return {k: _text_cells(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_text_cells(v) for v in value]
    return value


class StopAtFirst(SkipReport):
    """The report of a file every row of which must be good (prompts, task data, a BEIR
    folder's files): the first bad row raises `error` with `file:line: reason: detail; hint`.
    Blank lines are let through (counted)."""

    def __init__(self, error: type[Exception], hint: str):
        super().__init__()
        self.error, self.hint = error, hint

    def skip(self, reason: str, source, line: int = 0, detail: str = "", count: int = 1) -> None:
        if reason != BLANK_LINE:
            where = f"{source}:{line}" if line else str(source)
            raise self.error(f"{where}: {reason}" + (f": {detail}" if detail else "") + f"; {self.hint}")
        self.counts[reason] += count


def json_lines(path, error: type[Exception], hint: str) -> Iterator[tuple[int, object]]:
    """(line, value) of every non-blank line of a JSON-lines file (plain or compressed,
    whatever its name) that must hold no bad line: the first one, or a file that cannot be read
    to its end, raises `error` naming file:line, the reason and `hint` (what to write)."""
    try:
        for row in iter_rows(path, fmt="jsonl", skips=StopAtFirst(error, hint)):
            yield row.line, row.value
    except BadInputError as exc:
        if isinstance(exc, error):
            raise
        raise error(f"{exc}; {hint}") from None
