"""Every reader of users' files, fed random rows (hypothesis): random types, missing and extra
fields, byte-order marks, quotes, newlines, bad bytes and truncation.

Properties: every row is kept or reported at its `file:line` (kept + reported = rows, or a
named truncation "truncated after line N" covering the rest); no exception escapes but our
own `BadInputError` with a message naming the file; an inferred label round-trips from the
file to a model id and back to its exported name; rows every format can hold give the same
examples in jsonl, csv, tsv and parquet.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from megatron_biglm.data.readers import iter_records
from megatron_biglm.data.rows import SKIP, STOP, BadInputError, SkipReport, iter_rows
from megatron_biglm.finetune.data_files import label_text, load_split
from megatron_biglm.finetune.labels import kind_of
from megatron_biglm.finetune.tasks import get_task
from megatron_biglm.finetune.tasks.declaration import TaskDeclarationError, with_labels

FUZZ = settings(deadline=None, max_examples=60, database=None, suppress_health_check=[HealthCheck.too_slow])
LOCATION = re.compile(r"^(?P<file>.*?):(?P<line>\d+): (?P<reason>[a-z_0-9]+)(: (?P<detail>.*))?$", re.DOTALL)

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False),
                    st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                           max_size=3), max_leaves=5)
objects = st.dictionaries(st.sampled_from(["text", "label", "extra", "Text", ""]), values, max_size=4)
junk = st.binary(max_size=30).map(lambda b: b.replace(b"\n", b" "))
json_line = st.one_of(objects.map(lambda o: json.dumps(o).encode()), values.map(lambda v: json.dumps(v).encode()),
                      junk, st.just(b""), st.just(b"  \t"), st.just(b'{"text": "half \\ud800"}'))


_BASE: list[Path] = []


@pytest.fixture(autouse=True, scope="module")
def _fuzz_folder(tmp_path_factory):
    """Where the draws write their files (pytest's own temporary tree, cleaned by pytest)."""
    _BASE.append(tmp_path_factory.mktemp("row_fuzz"))


def _folder() -> Path:
    return Path(tempfile.mkdtemp(dir=_BASE[-1]))


def _compress(data: bytes, how: str) -> bytes:
    if how == "gz":
        return gzip.compress(data)
    if how == "zst":
        import zstandard
        return zstandard.ZstdCompressor().compress(data)
    return data


def _reported(report: SkipReport) -> dict[int, str]:
    """{line: reason} of every skipped row (the report keeps them all: max_examples is large)."""
    out = {}
    for example in report.example_lines():
        match = LOCATION.match(example)
        if match:
            out[int(match["line"])] = match["reason"]
    return out


def _truncation(report: SkipReport) -> int | None:
    """N of the one named loss "truncated after line N", or None."""
    for example in report.example_lines():
        found = re.search(r"unreadable_file: (?:truncated|unreadable) after line (\d+)", example)
        if found:
            return int(found[1])
        if re.search(r"unreadable_file: (truncated before its first line|unreadable)", example):
            return 0
    return None


def _accounts_for_every_line(lines: int, kept: list[int], report: SkipReport, *, whole_file_skip: bool = False):
    reported = _reported(report)
    assert not set(kept) & set(reported), (kept, reported)
    if whole_file_skip:
        assert not kept and report.counts["unreadable_file"] == 1
        return
    end = _truncation(report)
    covered = set(kept) | {n for n, reason in reported.items() if reason != "unreadable_file"}
    if end is None:
        assert covered == set(range(1, lines + 1)), (lines, kept, reported)
    else:  # every line before the damage, then one named loss
        assert covered == set(range(1, end + 1)) and report.counts["unreadable_file"] == 1, (end, kept, reported)


@FUZZ
@given(lines=st.lists(json_line, min_size=1, max_size=12), bom=st.booleans(),
       how=st.sampled_from(["plain", "gz", "zst"]), cut=st.none() | st.floats(0, 1))
def test_jsonl_rows_are_kept_or_reported(lines, bom, how, cut):
    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines) + b"\n"
    blob = _compress(data, how)
    if cut is not None and how != "plain":
        blob = blob[: max(1, int(len(blob) * cut))]  # (an empty .gz reads as an empty file)
    path = _folder() / f"r.jsonl{'' if how == 'plain' else '.' + how}"
    path.write_bytes(blob)
    report = SkipReport(max_examples=10**6)
    kept = [row.line for row in iter_rows(path, skips=report, on_unreadable=SKIP)]
    array = lines[0].lstrip().startswith(b"[")  # a JSON array, not JSON Lines: the whole file is one loss
    _accounts_for_every_line(len(lines), kept, report, whole_file_skip=array and "is a JSON array" in str(
        report.example_lines()))
    try:  # the stopping policy: all rows, or our error naming the file
        assert [row.line for row in iter_rows(path, skips=SkipReport(max_examples=10**6), on_unreadable=STOP)] == kept
    except BadInputError as exc:
        assert str(path) in str(exc)


cells = st.text(st.characters(blacklist_categories=("Cs",)), max_size=15)
junk_line = st.binary(max_size=20).map(lambda b: b.translate(None, b'"\n\r'))


@FUZZ
@given(header=st.lists(st.text("abcdefgh", min_size=1, max_size=4), min_size=1, max_size=4, unique=True),
       rows=st.lists(st.lists(cells, min_size=0, max_size=5), max_size=8),
       junk=st.lists(st.tuples(st.integers(0, 8), junk_line), max_size=3),
       fmt=st.sampled_from(["csv", "tsv"]), bom=st.booleans(), how=st.sampled_from(["plain", "gz"]))
def test_csv_and_tsv_rows_are_kept_or_reported(header, rows, junk, fmt, bom, how):
    buffer = io.StringIO()
    # The writer leaves a carriage return unquoted (it is not in its "\n" line end), which makes a
    # file no CSV reader can split into records; a file with one quotes every field, as RFC 4180 asks.
    quoting = csv.QUOTE_ALL if any("\r" in cell for row in rows for cell in row) else csv.QUOTE_MINIMAL
    writer = csv.writer(buffer, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n", quoting=quoting)
    writer.writerow(header)
    records = []
    for cells_ in rows:
        before = buffer.tell()
        writer.writerow(cells_)
        records.append(buffer.getvalue()[before:].encode())
    for at, line in sorted(junk, reverse=True):
        records.insert(min(at, len(records)), line + b"\n")
    data = (b"\xef\xbb\xbf" if bom else b"") + (buffer.getvalue().splitlines(keepends=True)[0].encode()
                                              if header else b"") + b"".join(records)
    path = _folder() / f"r.{fmt}{'.gz' if how == 'gz' else ''}"
    path.write_bytes(_compress(data, how))
    report = SkipReport(max_examples=10**6)
    got = list(iter_rows(path, skips=report))
    starts, line = [], 2
    for record in records:  # the first file line of each record
        starts.append(line)
        line += record.count(b"\n")
    reported = _reported(report)
    kept = [row.line for row in got]
    assert sorted(kept + [starts[max(i for i, s in enumerate(starts) if s <= n)] for n in reported]) == starts
    for row in got:  # a kept row has its header's names, and what the writer wrote (when not junk)
        assert list(row.value) == header
        index = starts.index(row.line)
        if index < len(records) and records[index] not in [j + b"\n" for _, j in junk]:
            written = next(csv.reader(io.StringIO(records[index].decode()), delimiter="\t" if fmt == "tsv" else ","))
            assert [row.value[h] for h in header][: len(written)] == written


@FUZZ
@given(docs=st.lists(st.one_of(st.text(max_size=30).map(lambda t: {"text": t}), objects, values.map(lambda v: {"text": v})),
                     min_size=1, max_size=10),
       bad=st.lists(st.tuples(st.integers(0, 10), junk), max_size=3), how=st.sampled_from(["plain", "gz", "zst"]),
       cut=st.none() | st.floats(0.2, 1))
def test_pretraining_documents_are_kept_or_reported(docs, bad, how, cut):
    lines = [json.dumps(d).encode() for d in docs]
    for at, line in bad:
        lines.insert(min(at, len(lines)), line)
    if lines[0].lstrip().startswith(b"["):
        lines.insert(0, b"{}")
    blob = _compress(b"\n".join(lines) + b"\n", how)
    if cut is not None and how != "plain":
        blob = blob[: int(len(blob) * cut)]
    path = _folder() / f"c.jsonl{'' if how == 'plain' else '.' + how}"
    path.write_bytes(blob)
    report = SkipReport(max_examples=10**6)
    records = list(iter_records([path], report=report))
    _accounts_for_every_line(len(lines), [r.line for r in records], report)
    for record in records:
        assert json.loads(lines[record.line - 1].decode().lstrip("\ufeff"))["text"] == record.texts["text"]
    try:
        list(iter_records([path], report=SkipReport(strict=True)))
    except BadInputError as exc:
        assert str(path) in str(exc) and "--strict" in str(exc)


label_values = st.one_of(st.integers(-20, 20), st.floats(-5, 5).map(lambda f: round(f, 1)),
                         st.sampled_from(["pos", "neg", " mid ", "1", "-3", "2.5", ""]), st.booleans(), st.none(),
                         st.lists(st.integers(0, 2), max_size=2))


@FUZZ
@given(labels=st.lists(label_values, min_size=1, max_size=12), fmt=st.sampled_from(["jsonl", "csv"]))
@example(labels=[[]], fmt="csv")  # a header-only csv
def test_an_inferred_label_round_trips_file_id_name(labels, fmt):
    folder = _folder()
    rows = [{"text": f"row {i}", "label": v} for i, v in enumerate(labels)]
    if fmt == "csv":
        rows = [{**r, "label": label_text(r["label"]) if r["label"] is not None else ""} for r in rows]
        rows = [r for r in rows if r["label"] is not None]
        path = folder / "t.csv"
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, ["text", "label"])
            writer.writeheader()
            writer.writerows(rows)
    else:
        path = folder / "t.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    try:
        task, _ = with_labels(get_task({"kind": "head", "fields": ["text"]}), str(path))
    except TaskDeclarationError as exc:  # fewer than two labels, or labels of mixed kinds: said, with the column
        kinds = {kind_of(v, label_text(v)) for v in (r["label"] for r in rows) if label_text(v)}
        if not rows:  # every drawn label was one a csv cell cannot hold: a header-only file
            assert "no row to infer labels from" in str(exc) and "only a header" in str(exc), str(exc)
        elif "mixes kinds of labels" in str(exc):
            assert len(kinds) > 1, (kinds, str(exc))
        else:
            assert "'label' column holds" in str(exc) and len(kinds) <= 1
        return
    assert len({kind_of(r["label"], label_text(r["label"])) for r in rows if label_text(r["label"])}) == 1
    names = task.dataset.label_names  # = the exported id2label, by index
    read, report = load_split(task.dataset, files=[str(path)])
    assert report.rows_seen == len(rows) == report.rows_kept + report.rows_dropped
    by_text = {r["text"]: r for r in rows}
    for row in read:
        assert names[row["label"]] == label_text(by_text[row["text"]]["label"])
    dropped = {r["text"] for r in rows} - {r["text"] for r in read}
    assert all(not label_text(by_text[t]["label"]) for t in dropped)


@FUZZ
@given(rows=st.lists(st.fixed_dictionaries({"text": cells, "label": st.sampled_from(["a", "b", "10", "2"])}),
                     min_size=1, max_size=8),
       numbers=st.booleans())
def test_every_format_gives_the_same_examples(rows, numbers):
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = _folder()
    if numbers:  # integer labels in the formats that hold numbers, their digits in csv/tsv
        rows = [{**r, "label": {"a": 1, "b": -1, "10": 10, "2": 2}[r["label"]]} for r in rows]
    files = {"jsonl": folder / "t.jsonl", "csv": folder / "t.csv", "tsv": folder / "t.tsv",
             "parquet": folder / "t.parquet"}
    files["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    for fmt in ("csv", "tsv"):
        with open(files[fmt], "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, ["text", "label"], delimiter="\t" if fmt == "tsv" else ",")
            writer.writeheader()
            writer.writerows(rows)
    pq.write_table(pa.Table.from_pylist(rows), files["parquet"])
    schema = get_task({"kind": "head", "fields": ["text"], "labels": ["1", "2", "10", "-1", "a", "b"]}).dataset
    got = {fmt: load_split(schema, files=[str(path)])[0] for fmt, path in files.items()}
    kept = [r for r in rows if r["text"].strip() and not (r["text"] == "" or not r["text"].strip())]
    assert got["jsonl"] == got["csv"] == got["tsv"] == got["parquet"]
    assert [r["text"] for r in got["jsonl"]] == [r["text"] for r in kept]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "tsv", "parquet"])
def test_truncating_any_compressed_format_is_a_named_loss(fmt, tmp_path):
    """Every cut of a compressed file: the rows before it, then one named loss (or the error)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": f"document {i} " * 5, "label": i % 3} for i in range(60)]
    if fmt == "parquet":
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), sink)
        data = sink.getvalue()
    elif fmt == "jsonl":
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    else:
        sep = "\t" if fmt == "tsv" else ","
        data = ("text" + sep + "label\n" + "".join(f"{r['text']}{sep}{r['label']}\n" for r in rows)).encode()
    blob = gzip.compress(data)
    for cut in range(1, len(blob), max(1, len(blob) // 40)):
        path = tmp_path / f"t.{fmt}.gz"
        path.write_bytes(blob[:cut])
        report = SkipReport(max_examples=10**6)
        got = [row.value for row in iter_rows(path, skips=report, on_unreadable=SKIP)]
        assert report.counts["unreadable_file"] == 1 and _truncation(report) is not None, cut
        assert [str(v["text"]) for v in got] == [r["text"] for r in rows[: len(got)]]
        with pytest.raises(BadInputError, match=re.escape(str(path))):
            list(iter_rows(path, skips=SkipReport(), on_unreadable=STOP))


ids = st.one_of(st.sampled_from(["d1", "d2", "q1", "q2", "1", ""]), st.integers(0, 3))
beir_rows = st.lists(st.one_of(st.fixed_dictionaries({"_id": ids, "text": st.one_of(st.text(max_size=10), values)},
                                                     optional={"title": values, "x": values}), objects, values),
                     max_size=6)
qrels_cells = st.one_of(ids.map(str), st.sampled_from(["1", "0", "1.0", "2.5", "-1", "x", "", "1e0"]),
                        st.text("\t abc\"", max_size=4))


@FUZZ
@given(corpus=beir_rows, queries=beir_rows,
       qrels=st.lists(st.one_of(st.lists(qrels_cells, max_size=4).map(lambda c: "\t".join(c).encode()), junk),
                      max_size=6),
       keep_first=st.booleans(), skip_unknown=st.booleans())
def test_a_beir_folder_loads_or_is_refused_by_file(corpus, queries, qrels, keep_first, skip_unknown):
    from megatron_biglm.finetune.retrieval.beir import BeirFormatError, load_beir

    folder = _folder()
    (folder / "qrels").mkdir()
    corpus = [{"_id": "d1", "text": "red apples"}, *corpus]  # a valid folder, and the random rows in it
    queries = [*queries, {"_id": "q1", "text": "fruit"}]
    qrels = [b"q1\td1\t1", *qrels]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (folder / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (folder / "qrels" / "test.tsv").write_bytes(b"".join(line + b"\n" for line in qrels))
    try:
        data = load_beir(folder, duplicate_ids="keep_first" if keep_first else "error",
                         unknown_documents="skip" if skip_unknown else "error")
    except BeirFormatError as exc:  # refused: the message names the file (or the folder) at fault
        assert str(folder) in str(exc)
        return
    assert all(isinstance(t, str) for t in [*data.corpus.values(), *data.queries.values()])
    assert data.queries and set(data.queries) == set(data.qrels)
    for qid, rels in data.qrels.items():
        assert all(isinstance(v, int) for v in rels.values())
        assert any(v > 0 and doc in data.corpus for doc, v in rels.items()), (qid, rels)


plain_cells = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=12).filter(
    lambda t: '"' not in t and t.strip())


@FUZZ
@given(rows=st.lists(st.tuples(plain_cells, plain_cells), min_size=2, max_size=15), data=st.data(),
       fmt=st.sampled_from(["csv", "tsv"]), multiline=st.booleans())
def test_one_unbalanced_quote_is_named_at_its_line_and_balanced_ones_read_back(rows, data, fmt, multiline):
    """Rows written with quoting read back as written (a cell may hold line breaks and doubled
    quotes); one quote opened at the start of a cell and never closed is a BadInputError at that
    row's line, never rows swallowed into one cell."""
    sep = "\t" if fmt == "tsv" else ","
    if multiline:
        rows = [(a + '\nsaid "so"', b) for a, b in rows]
    path = _folder() / f"t.{fmt}"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, delimiter=sep, lineterminator="\n").writerows([("text", "label"), *rows])
    got = [(r.value["text"], r.value["label"]) for r in iter_rows(path, skips=SkipReport(strict=True))]
    assert got == rows
    if multiline:
        return
    k = data.draw(st.integers(0, len(rows) - 2), label="row with the open quote")
    lines = path.read_text(encoding="utf-8").split("\n")
    bare = [sep.join(c.replace(sep, " ").replace("\n", " ").replace("\r", " ") for c in row) for row in rows]
    bare[k] = '"' + bare[k]
    path.write_text("\n".join([lines[0], *bare]) + "\n", encoding="utf-8")
    with pytest.raises(BadInputError, match=rf"^{re.escape(str(path))}:{k + 2}: invalid_row: an unbalanced quote"):
        list(iter_rows(path, skips=SkipReport()))
