"""Users' row files through the one row reader (data/rows.py) and the fine-tuning row checks:
an inferred label means what the file says, a file that cannot be read to its end stops the
run (or, opted in, is one named loss), a missing column is named with the columns found, and
an undecodable byte is `file:line: invalid_utf8` in every format."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from megatron_biglm.data.readers import SkipReport, iter_texts
from megatron_biglm.data.rows import BadInputError, iter_rows
from megatron_biglm.finetune.data_files import label_text, load_split
from megatron_biglm.finetune.tasks import get_task
from megatron_biglm.finetune.tasks.declaration import TaskDeclarationError, with_labels

HEAD = {"kind": "head", "fields": ["text"], "label_field": "label"}


def jsonl(path, rows, compress=False):
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def inferred(files, spec=HEAD):
    task, _ = with_labels(get_task(spec), files)
    return task


@pytest.mark.parametrize("values", [[1, 2], [-1, 1], list(range(11)), [10, 2, 7], [0.5, 2, -3],
                                    ["b", "a"], [True, False]],
                         ids=["1/2", "-1/1", "0..10", "non-contiguous", "floats", "strings", "booleans"])
def test_an_inferred_label_means_what_the_file_says(values, tmp_path):
    rows = [{"text": f"row {i}", "label": values[i % len(values)]} for i in range(3 * len(values))]
    files = {"jsonl": jsonl(tmp_path / "t.jsonl", rows)}
    (tmp_path / "t.csv").write_text("text,label\n" + "".join(f"{r['text']},{label_text(r['label'])}\n" for r in rows))
    files["csv"] = str(tmp_path / "t.csv")
    for fmt, path in files.items():
        task = inferred(path)
        names = task.dataset.label_names
        numbers = [float(n) for n in names if n not in ("True", "False") and not n.isalpha()]
        assert numbers == sorted(numbers), names                      # numbers in numeric order
        read, report = load_split(task.dataset, files=[path])
        assert report.rows_kept == len(rows) and not report.counts, (fmt, report.example_lines())
        # file -> model id -> exported name (id2label is label_names by index)
        assert [names[r["label"]] for r in read] == [label_text(r["label"]) for r in rows], fmt
        assert names == inferred(files["jsonl"]).dataset.label_names  # every format, the same names


def test_row_order_never_changes_the_ids(tmp_path):
    rows = [{"text": "x", "label": v} for v in (10, 2, 1, 2, 10)]
    first = inferred(jsonl(tmp_path / "a.jsonl", rows)).dataset.label_names
    assert first == ("1", "2", "10") == inferred(jsonl(tmp_path / "b.jsonl", rows[::-1])).dataset.label_names


def test_declared_labels_keep_their_index_meaning_and_builtins_their_minus_one(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", [{"text": "a", "label": v} for v in (0, 1, "pos", -1)])
    rows, report = load_split(get_task({**HEAD, "labels": ["neg", "pos"]}).dataset, files=[path])
    assert [r["label"] for r in rows] == [0, 1, 1] and report.counts == {"bad_label": 1}  # -1: no marker here
    numbered = jsonl(tmp_path / "n.jsonl", [{"text": "a", "label": v} for v in (1, 2, 0)])
    rows, report = load_split(get_task({**HEAD, "labels": [1, 2]}).dataset, files=[numbered])
    assert [r["label"] for r in rows] == [0, 1] and report.counts == {"bad_label": 1}  # 0 is no index of names 1, 2
    cb = jsonl(tmp_path / "cb.jsonl", [{"premise": "p", "hypothesis": "h", "label": v} for v in (2, "neutral", -1)])
    rows, report = load_split("super_glue/cb", files=[cb], require_labels=False)
    assert [r["label"] for r in rows] == [2, 2, None] and not report.counts


def test_a_truncated_gz_stops_fine_tuning_naming_it_or_is_one_named_loss(tmp_path):
    rows = [{"text": f"row number {i} " * 20, "label": i % 2} for i in range(200)]
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    cut = tmp_path / "train.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    schema = get_task({**HEAD, "labels": ["a", "b"]}).dataset
    with pytest.raises(BadInputError, match=r"train\.jsonl\.gz:\d+: unreadable_file: truncated after line \d+ "
                                            r"\(EOFError.*finetune\.skip_unreadable=true"):
        load_split(schema, files=[str(cut)])
    with pytest.raises(BadInputError, match=r"train\.jsonl\.gz:\d+: unreadable_file: truncated after line"):
        inferred(str(cut))
    kept, report = load_split(schema, files=[str(cut)], skip_unreadable=True)
    assert 0 < len(kept) < len(rows) and report.counts == {"unreadable_file": 1}
    assert report.example_lines() == [f"{cut}:{len(kept) + 1}: unreadable_file: truncated after line {len(kept)} "
                                      "(EOFError: Compressed file ended before the end-of-stream marker was reached)"]


def test_a_truncated_corpus_is_counted_naming_where_it_ended(tmp_path):
    path = tmp_path / "c.jsonl.gz"
    data = gzip.compress("".join(json.dumps({"text": f"doc {i} " * 30}) + "\n" for i in range(300)).encode())
    path.write_bytes(data[: len(data) * 2 // 3])
    report = SkipReport()
    kept = list(iter_texts([path], report=report))
    assert report.counts == {"unreadable_file": 1} and report.files_failed == 1
    assert f"{path}:{len(kept) + 1}: unreadable_file: truncated after line {len(kept)}" in report.example_lines()[0]
    with pytest.raises(BadInputError, match=rf"c\.jsonl\.gz:{len(kept) + 1}: unreadable_file: truncated after "
                                            rf"line {len(kept)}.*drop --strict"):
        list(iter_texts([path], report=SkipReport(strict=True)))


def test_a_missing_label_column_is_named_with_the_columns_found(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    spec = {**HEAD, "label_field": "sentiment", "fields": ["review"]}
    (tmp_path / "t.tsv").write_text("text\tlabel\nfine day\tpos\n")
    with pytest.raises(TaskDeclarationError, match=r"no column 'sentiment': \S+t\.tsv has \['label', 'text'\]\. "
                                                   r"Set finetune\.task\.label_field"):
        inferred(str(tmp_path / "t.tsv"), spec)
    pq.write_table(pa.table({"review": ["fine day"], "stars": [5]}), tmp_path / "t.parquet")
    with pytest.raises(TaskDeclarationError, match=r"no column 'sentiment': \S+t\.parquet has \['review', 'stars'\]"):
        inferred(str(tmp_path / "t.parquet"), spec)
    (tmp_path / "s.csv").write_text("review;sentiment\nfine day;pos\n")
    with pytest.raises(TaskDeclarationError, match=r"has \['review;sentiment'\] \('review;sentiment' looks like "
                                                   r"several column names in one: a \.csv file is comma-separated"):
        inferred(str(tmp_path / "s.csv"), spec)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_an_undecodable_byte_is_file_line_reason_in_every_format(fmt, tmp_path):
    sep = {"csv": ",", "tsv": "\t"}.get(fmt)
    lines = ([f"text{sep}label", f"fine{sep}a", f"caf\udce9{sep}b", f"good{sep}b"] if sep else
             ['{"text": "fine", "label": "a"}', '{"text": "caf\udce9", "label": "b"}', '{"text": "good", "label": "b"}'])
    path = tmp_path / f"t.{fmt}"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")
    bad_line = 3 if sep else 2
    rows, report = load_split(get_task({**HEAD, "labels": ["a", "b"]}).dataset, files=[str(path)])
    assert [r["text"] for r in rows] == ["fine", "good"] and report.counts == {"invalid_utf8": 1}
    assert report.example_lines() == [f"{path}:{bad_line}: invalid_utf8: invalid continuation byte at byte "
                                      f"{3 if sep else 13} of the line"]
    with pytest.raises(BadInputError, match=rf"t\.{fmt}:{bad_line}: invalid_utf8"):
        load_split(get_task({**HEAD, "labels": ["a", "b"]}).dataset, files=[str(path)], strict=True)


def test_the_row_reader_numbers_rows_and_accepts_a_bom_in_every_format(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.csv").write_bytes(b"\xef\xbb\xbftext,n\n\"two\nlines\",1\n\nlast,2,extra\nend,3\n")
    report = SkipReport()
    rows = list(iter_rows(tmp_path / "a.csv", skips=report))
    assert [(r.line, r.value) for r in rows] == [(2, {"text": "two\nlines", "n": "1"}), (6, {"text": "end", "n": "3"})]
    assert report.example_lines() == [f"{tmp_path / 'a.csv'}:4: blank_line",
                                      f"{tmp_path / 'a.csv'}:5: invalid_row: 3 cells under a header of 2 (text, n)"]
    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff"], pa.binary())}), tmp_path / "b.parquet")
    report = SkipReport()
    assert [(r.line, r.value) for r in iter_rows(tmp_path / "b.parquet", skips=report)] == [(1, {"text": "ok"})]
    assert report.example_lines()[0].startswith(f"{tmp_path / 'b.parquet'}:2: invalid_utf8")


def test_integer_negative_and_string_labels_give_the_same_model_and_id2label(tokenizer_dir, tmp_path):
    """The same reviews labelled 1/2 and -5/10 in jsonl and neg/pos in csv: one model, bit for
    bit, and the exported id2label names each label as its file wrote it."""
    import yaml

    from megatron_biglm.cli.finetune import main
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.export.head_export import export_head

    reviews = [("sweet night", 1), ("foul day", 0), ("noble lord", 1), ("vile man", 0), ("kind soul", 1), ("bad end", 0)]
    spellings = {"ints": [1, 2], "negative": [-5, 10], "strings": ["neg", "pos"]}
    weights, id2label = {}, {}
    for name, (neg, pos) in spellings.items():
        folder = tmp_path / name
        folder.mkdir()
        rows = [{"review": text, "sentiment": pos if label else neg} for text, label in reviews]
        if name == "strings":
            data = folder / "train.csv"
            data.write_text("review,sentiment\n" + "".join(f"{r['review']},{r['sentiment']}\n" for r in rows))
        else:
            data = Path(jsonl(folder / "train.jsonl", rows))
        config = folder / "ft.yaml"
        config.write_text(yaml.safe_dump({
            "run_dir": str(folder / "run"), "data": {"tokenizer": str(tokenizer_dir)},
            "model": {"preset": "tiny", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64},
            "finetune": {"task": {"kind": "head", "fields": ["review"], "label_field": "sentiment"},
                         "data": {"train": str(data), "validation": str(data)}, "max_length": 16, "epochs": 2},
            "training": {"micro_batch_size": 2, "global_batch_size": 2}}))
        assert main(["--config", str(config)]) == 0
        checkpoint = open_checkpoint(folder / "run" / "checkpoints")
        weights[name] = {key: checkpoint.weights()[key] for key in checkpoint.weights()}
        id2label[name] = dict(enumerate(export_head(checkpoint).label_names))
    assert id2label == {"ints": {0: "1", 1: "2"}, "negative": {0: "-5", 1: "10"}, "strings": {0: "neg", 1: "pos"}}
    for name in ("negative", "strings"):
        assert weights[name].keys() == weights["ints"].keys()
        assert all(torch.equal(weights[name][k], weights["ints"][k]) for k in weights["ints"]), name


def test_an_unpaired_surrogate_escape_is_dropped_by_line_not_handed_to_the_tokenizer(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"text": "fine", "label": "a"}\n{"text": "half \\ud83d", "label": "b"}\n'
                    '{"text": "pair \\ud83d\\ude00", "label": "b"}\n')
    rows, report = load_split(get_task({**HEAD, "labels": ["a", "b"]}).dataset, files=[str(path)])
    assert [r["text"] for r in rows] == ["fine", "pair \U0001F600"] and report.counts == {"lone_surrogate": 1}
    assert report.example_lines()[0].startswith(f"{path}:2: lone_surrogate")


def test_multi_label_values_are_names_too(tmp_path):
    path = jsonl(tmp_path / "m.jsonl", [{"text": "a", "tags": [3, 1]}, {"text": "b", "tags": 10}, {"text": "c", "tags": []},
                                        {"text": "d", "tags": {"x": 1}}])
    task = inferred(path, {"kind": "head", "fields": ["text"], "label_field": "tags",
                           "problem_type": "multi_label_classification"})
    rows, report = load_split(task.dataset, files=[path])
    assert task.dataset.label_names == ("1", "3", "10")
    assert [r["tags"] for r in rows] == [(0, 1), (2,), ()] and report.counts == {"bad_label": 1}
