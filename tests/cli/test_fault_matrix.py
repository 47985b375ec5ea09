"""The fault matrix: every bad input a user can hand the tools, one row each.

Each row builds one bad input, runs the user-facing entry on it (a CLI's `main(argv)` or the
documented Python entry) and asserts three things: the exit status or exception type; a
message fragment that tells the user what to do; and that nothing was written that looks
valid (no dataset, export, results or sealed checkpoint under the row's output folder, and
the checkpoints it read unchanged, `latest` included).

Read the table (FAULTS) top to bottom: area, name, what is run, what it must say.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import pytest

from checkpoint_damage import ITEMS, own_process_group, saved_run, train_data, zero_bytes_in_item  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("own_process_group")


@dataclass
class Env:
    """What a row may use: a fresh folder, the shared tiny run (its checkpoints, data and
    config) and the 400-entry tokenizer of another run."""
    tmp: Path
    run: tuple
    other_tokenizer: Path
    copies: list

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    @property
    def tokenizer(self) -> str:
        return self.run[1].tokenizer

    @property
    def prefix(self) -> str:
        return self.run[1].prefix

    @property
    def config(self) -> str:
        return str(self.run[0].parent / "config.yaml")

    def checkpoints(self) -> Path:
        """A private copy of the run's checkpoints (iter_0000002, iter_0000004, latest)."""
        root = self.tmp / "ckpt"
        if not root.exists():
            shutil.copytree(self.run[0], root)
            self.copies.append(root)
        return root

    def file(self, name: str, content: bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return path


# ------------------------------------------------------------------ the entries rows run
def preprocess(env, *inputs, tokenizer=None):
    from megatron_biglm.cli.preprocess import main
    return main(["--input", *map(str, inputs), "--output-prefix", str(env.out / "corpus"),
                 "--tokenizer", tokenizer or env.tokenizer, "--strict", "--quiet"])


def train(env, *overrides):
    from megatron_biglm.cli.train import main
    return main(["--config", env.config, f"run_dir={env.out / 'run'}", *overrides])


def resume(env, root, *overrides):
    return train(env, f"checkpoint.dir={root}", "checkpoint.load=auto", "schedule.train_steps=6", *overrides)


def inspect(env, prefix):
    from megatron_biglm.cli.inspect_dataset import main
    return main([str(prefix), "--doc", "0"])


def export(env, checkpoint, *extra):
    from megatron_biglm.cli.convert import main
    return main(["to-hf", "--checkpoint", str(checkpoint), "--output", str(env.out / "hf"), "--quiet", *extra])


def evaluate(env, path, **model_args):
    from megatron_biglm.evaluation.models import BiGLMEvalLM
    return BiGLMEvalLM(path=str(path), device="cpu", progress=False, **model_args)


def eval_cli(env, task, rows, path=None):
    from megatron_biglm.cli.eval_zero_shot import main
    data = env.file(f"data/{task}.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    return main(["--model", "biglm", "--model-args", f"path={path or env.run[0]},progress=false", "--suite", task,
                 "--data-dir", str(data.parent), "--task-dir", str(env.tmp / "tasks"),
                 "--output", str(env.out / "results.json")])


def generate(env, prompts, tokenizer=None, **options):
    from generation_fakes import MASK, ScriptedAdapter
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
    generator = MaskPredictGenerator(ScriptedAdapter(), tokenizer or SimpleNamespace(mask_token_id=MASK))
    return generator.generate(prompts, GenerationConfig(**options))


def finetune_rows(env, task, rows):
    from megatron_biglm.finetune.data_files import load_split
    data = env.file("ft.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    return load_split(task, files=[str(data)], strict=True)


REVIEWS = b"review,sentiment\nsweet night,pos\nfoul day,neg\nnoble lord,pos\nvile man,neg\n"
HEAD = {"kind": "head", "fields": ["review"], "label_field": "sentiment"}


def own_finetune(env, *overrides, task=HEAD, train=REVIEWS, valid=REVIEWS, valid_name="valid.csv",
                 run_dir=None, train_name="train.csv"):
    """`python -m megatron_biglm.cli.finetune` on a user's own csv (a tiny model, 2 files)."""
    import yaml

    from megatron_biglm.cli.finetune import main
    files = {"train": str(e_file(env, train_name, train)), "validation": str(e_file(env, valid_name, valid))}
    config = env.file("ft.yaml", yaml.safe_dump({
        "run_dir": str(run_dir or env.out / "ft"), "data": {"tokenizer": env.tokenizer},
        "model": {"preset": "tiny", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64},
        "finetune": {"task": task, "data": files, "max_length": 16, "epochs": 1},
        "training": {"micro_batch_size": 2, "global_batch_size": 2}}).encode())
    return main(["--config", str(config), *overrides])


def e_file(env, name, content):
    return env.file(name, content) if content is not None else env.tmp / name


def other_run(env) -> Path:
    """A run_dir holding a finished fine-tune of another task (its record says so)."""
    folder = env.tmp / "other"
    folder.mkdir()
    (folder / "finetune_run.json").write_text(json.dumps({"task": "rte_head"}))
    (folder / "results.json").write_text("{}")
    return folder


def damaged(env, item=ITEMS["model weight"]) -> Path:
    root = env.checkpoints()
    zero_bytes_in_item(root / "iter_0000004", item)
    return root


def truncated(env, name="dist/__0_0.distcp") -> Path:
    root = env.checkpoints()
    path = root / "iter_0000004" / name
    path.write_bytes(path.read_bytes()[:-100])
    return root


def removed(env, name="train_state.json") -> Path:
    root = env.checkpoints()
    (root / "iter_0000004" / name).unlink()
    return root


def indexed_copy(env, bin_bytes=None, idx_bytes=None) -> Path:
    """A copy of the run's indexed data with its .bin or .idx replaced."""
    src = Path(env.prefix)
    prefix = env.tmp / "data" / "copy"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for ext, new in ((".bin", bin_bytes), (".idx", idx_bytes)):
        data = Path(str(src) + ext).read_bytes()
        Path(str(prefix) + ext).write_bytes(new(data) if new else data)
    return prefix


PREVIOUS = r"checkpoint\.load=\S*ckpt/iter_0000002"
STRICT = r"fix the input, or drop --strict"
CB = {"premise": "It rained.", "hypothesis": "The street is wet.", "label": 0}
ARC = {"question": "Which is a color?", "choices": {"text": ["red", "dog"], "label": ["A", "B"]}, "answerKey": "A"}


@dataclass(frozen=True)
class Fault:
    area: str
    name: str
    act: Callable[[Env], object]
    expect: object    # an exit status, or the exception type raised
    says: str         # regex the message must match: what to do


FAULTS = [
    # corpus: python -m megatron_biglm.cli.preprocess --strict (without it such rows are skipped and counted)
    Fault("corpus", "bad JSON", lambda e: preprocess(e, e.file("c.jsonl", b'{"text": "unterminated\n')),
          1, r"c\.jsonl:1: invalid_json.*" + STRICT),
    Fault("corpus", "missing key", lambda e: preprocess(e, e.file("c.jsonl", b'{"body": "x"}\n')),
          1, r"c\.jsonl:1: missing_key: no key 'text' \(keys: \['body'\]\).*" + STRICT),
    Fault("corpus", "non-UTF-8", lambda e: preprocess(e, e.file("c.jsonl", b'{"text": "caf\xe9"}\n')),
          1, r"c\.jsonl:1: invalid_utf8.*" + STRICT),
    Fault("corpus", "empty document", lambda e: preprocess(e, e.file("c.jsonl", b'{"text": "  "}\n')),
          1, r"c\.jsonl:1: empty_document.*" + STRICT),
    Fault("corpus", "unreadable file", lambda e: preprocess(e, e.file("c.jsonl.gz", b"not gzip at all")),
          1, r"c\.jsonl\.gz: unreadable_file.*" + STRICT),
    # tokenizer
    Fault("tokenizer", "missing dir (preprocess)",
          lambda e: preprocess(e, e.file("c.jsonl", b'{"text": "x"}\n'), tokenizer=str(e.tmp / "no_tok")),
          1, r"Pass a directory"),
    Fault("tokenizer", "missing dir (train)", lambda e: train(e, f"data.tokenizer={e.tmp / 'no_tok'}"),
          2, r"data\.tokenizer=\S+no_tok does not exist \(a tokenizer directory is expected\)"),
    Fault("tokenizer", "no mask token (generation)",
          lambda e: generate(e, ["hi"], tokenizer=SimpleNamespace(mask_token_id=None)),
          ValueError, r"has no mask token.*set tokenizer\.mask_token to the model's mask token"),
    # indexed data (checked at open: data/indexed_tools.py)
    Fault("indexed data", "truncated .bin (train)",
          lambda e: train(e, f"data.blend=['{indexed_copy(e, bin_bytes=lambda d: d[:len(d) // 2])}']"),
          2, r"copy\.bin: [\d,]+ bytes, but \S+copy\.idx describes [\d,]+ bytes.*re-run python -m megatron_biglm\.cli\.preprocess"),
    Fault("indexed data", "truncated .bin (inspect)",
          lambda e: inspect(e, indexed_copy(e, bin_bytes=lambda d: d[:len(d) // 2])),
          1, r"truncated \.bin.*re-run python -m megatron_biglm\.cli\.preprocess"),
    Fault("indexed data", "bad magic (inspect)", lambda e: inspect(e, indexed_copy(e, idx_bytes=lambda d: b"NOTANIDX!" + d[9:])),
          1, r"copy\.idx.*not a Megatron index"),
    Fault("config", "missing data path", lambda e: train(e, f"data.blend=['{e.tmp / 'nothing'}']"),
          2, r"no indexed dataset at .*need PREFIX\.bin and PREFIX\.idx"),
    # config: python -m megatron_biglm.cli.train --config RUN.yaml KEY=VALUE
    Fault("config", "unknown key", lambda e: train(e, "optimizer.lrr=1"),
          2, r"unknown config key 'optimizer\.lrr' \(did you mean 'lr'\?\); valid keys in optimizer"),
    Fault("config", "bad type", lambda e: train(e, "optimizer.lr=fast"),
          2, r"'optimizer\.lr': expected float, got 'fast': it must be a number"),
    Fault("config", "objective alpha=0.6", lambda e: train(e, "objective.alpha=0.6"),
          2, r"alpha=0\.6 must be in "),
    Fault("config", "bad batch arithmetic", lambda e: train(e, "training.global_batch_size=6"),
          2, r"pick a global batch that is a multiple of 4"),
    # checkpoint
    Fault("checkpoint", "truncated file (resume)", lambda e: resume(e, truncated(e)),
          2, r"is truncated: file dist/__0_0\.distcp has \d+ bytes.*" + PREVIOUS),
    Fault("checkpoint", "corrupt model weight (resume)", lambda e: resume(e, damaged(e)),
          2, r"embedding\.word_embeddings\.weight fail their CRC-32.*resume from the previous checkpoint: `" + PREVIOUS),
    Fault("checkpoint", "corrupt optimizer state (export)",
          lambda e: export(e, damaged(e, ITEMS["optimizer state"]) / "iter_0000004"),
          1, r"optimizer\.state\.exp_avg\.embedding\.word_embeddings\.weight fail.*" + PREVIOUS),
    Fault("checkpoint", "corrupt optimizer state (eval CLI)",
          lambda e: eval_cli(e, "arc_easy", [ARC], path=damaged(e, ITEMS["optimizer state"]) / "iter_0000004"),
          1, r"optimizer\.state\.exp_avg\.embedding\.word_embeddings\.weight fail.*" + PREVIOUS),
    Fault("checkpoint", "missing file (eval)", lambda e: evaluate(e, removed(e) / "iter_0000004"),
          Exception, r"file train_state\.json is missing.*" + PREVIOUS),
    Fault("checkpoint", "wrong shapes (resume)", lambda e: resume(e, e.checkpoints(), "model.num_layers=3"),
          2, r"model\.num_layers: checkpoint=2, this run=3\. Use the checkpoint's model settings"),
    Fault("checkpoint", "wrong vocab (export tokenizer)",
          lambda e: export(e, e.checkpoints(), "--tokenizer", str(e.other_tokenizer)),
          1, r"is not the tokenizer the model was trained with"),
    # eval data: python -m megatron_biglm.cli.eval_zero_shot --data-dir
    Fault("eval data", "missing fields", lambda e: eval_cli(e, "boolq", [{"question": "is it?", "label": 1}]),
          1, r"boolq\.jsonl:1: boolq row lacks passage; write every row of boolq in its HF schema"),
    Fault("eval data", "empty choices",
          lambda e: eval_cli(e, "arc_easy", [ARC, {**ARC, "choices": {"text": [], "label": []}}]),
          1, r"arc_easy\.jsonl:2: arc_easy row has no choices.*give each question at least two choices"),
    # generation: MaskPredictGenerator.generate / GenerationConfig
    Fault("generation", "length 0", lambda e: generate(e, ["hi"], length=0),
          ValueError, r"length must be >= 1, got 0: ask for at least one token"),
    Fault("generation", "bad option value", lambda e: generate(e, ["hi"], temperature=-1.0),
          ValueError, r"temperature must be >= 0 \(0 is greedy\)"),
    Fault("generation", "empty prompt", lambda e: generate(e, [""], length=2),
          ValueError, r"prompt 0 is empty.*give every prompt some text"),
    # fine-tuning data: finetune.data_files.load_split(strict=True)
    Fault("fine-tuning", "bad row", lambda e: finetune_rows(e, "super_glue/cb", [CB, {**CB, "hypothesis": ""}]),
          ValueError, r"ft\.jsonl:2: empty_field: field 'hypothesis' is empty.*" + STRICT),
    Fault("fine-tuning", "unknown task", lambda e: finetune_rows(e, "glue/nosuch", [CB]),
          ValueError, r"unknown data set 'glue/nosuch'; known: .*super_glue/cb"),
    # fine-tuning on one's own data: python -m megatron_biglm.cli.finetune (stops before training)
    Fault("fine-tuning", "typo'd option", lambda e: own_finetune(e, "finetune.options.poolng=first"),
          2, r"unknown option 'finetune\.options\.poolng' for task kind 'head' \(did you mean 'pooling'\?\); "
             r"valid keys in finetune\.options: pooling"),
    Fault("fine-tuning", "typo'd split key", lambda e: own_finetune(e, f"finetune.data.valdation={e.tmp}/x.csv"),
          2, r"unknown split 'finetune\.data\.valdation'.*\(did you mean 'validation'\?\)"),
    Fault("fine-tuning", "typo'd task key",
          lambda e: own_finetune(e, task={**HEAD, "label_feild": "sentiment"}),
          2, r"unknown task key 'finetune\.task\.label_feild' \(did you mean 'label_field'\?\)"),
    Fault("fine-tuning", "missing validation file", lambda e: own_finetune(e, valid=None, valid_name="nowhere.csv"),
          2, r"finetune\.data\.validation: \S+nowhere\.csv does not exist"),
    Fault("fine-tuning", "every row lacks the label column",
          lambda e: own_finetune(e, valid=b"review,label\nsweet night,pos\n"),
          2, r"finetune\.data\.validation has no usable row.*valid\.csv:2: unlabeled: no field 'sentiment' "
             r"\(fields: \['label', 'review'\]\).*reads the columns \['review', 'sentiment'\]; labels: \['neg', 'pos'\]"),
    Fault("fine-tuning", "empty file", lambda e: own_finetune(e, valid=b""),
          2, r"finetune\.data\.validation has no usable row.*no rows at all: is the file empty"),
    Fault("fine-tuning", "JSON array", lambda e: own_finetune(e, valid=b'[{"review": "x", "sentiment": "pos"}]',
                                                          valid_name="valid.jsonl"),
          2, r"valid\.jsonl is a JSON array; JSON Lines holds one JSON object per line"),
    Fault("fine-tuning", "unknown format", lambda e: own_finetune(e, valid_name="valid.txt"),
          2, r"valid\.txt: fine-tuning data must be jsonl .*csv, tsv or parquet.*rename the file"),
    Fault("fine-tuning", "run_dir of another task", lambda e: own_finetune(e, run_dir=other_run(e)),
          2, r"holds another run \(task: 'rte_head' there.*set finetune\.overwrite=true"),
]

# ------------------------------------------------------------------ users' row files (data/rows.py): labels, a
# truncated file, a missing column, an undecodable byte. A run that must succeed writes outside out/.
def shown_run(env, *overrides, **files):
    """`own_finetune` in its own folder, its notes (stdout) shown with its errors (the table reads stderr)."""
    import sys
    with contextlib.redirect_stdout(sys.stderr):
        return own_finetune(env, *overrides, run_dir=env.tmp / "own", **files)


def labelled(values, *, name="train.jsonl") -> dict:
    """REVIEWS' rows as jsonl (or csv), the k-th distinct label written as values[k] (JSON numbers)."""
    rows = [line.split(",") for line in REVIEWS.decode().splitlines()[1:]]
    rows = [(text, values[["neg", "pos"].index(label)]) for text, label in rows] if len(values) == 2 else \
        [(f"{rows[i % 4][0]} {i}", v) for i, v in enumerate(values)]
    data = b"".join(json.dumps({"review": t, "sentiment": v}).encode() + b"\n" for t, v in rows)
    return {"train": data, "valid": data, "train_name": name, "valid_name": "valid.jsonl"}


def truncated_gz(rows: int = 60) -> bytes:
    data = gzip.compress(b"".join(json.dumps({"review": f"review number {i} " * 8, "sentiment": ["neg", "pos"][i % 2]})
                                  .encode() + b"\n" for i in range(rows)))
    return data[: len(data) // 2]


def parquet_bytes(rows) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), sink)
    return sink.getvalue()


FAULTS += [
    Fault("fine-tuning", "integer labels 1/2 (jsonl)", lambda e: shown_run(e, **labelled([1, 2])),
          0, r"labels inferred from the training split's 'sentiment' column: 0: 1, 1: 2\n.*train: rows 4: kept 4, dropped 0"),
    Fault("fine-tuning", "integer labels -1/1 (jsonl)", lambda e: shown_run(e, **labelled([-1, 1])),
          0, r"'sentiment' column: 0: -1, 1: 1\n.*train: rows 4: kept 4, dropped 0"),
    Fault("fine-tuning", "integer labels 0..10 (jsonl)", lambda e: shown_run(e, **labelled(list(range(11)))),
          0, r"'sentiment' column: 0: 0, 1: 1, 2: 2, 3: 3, .* 9: 9, 10: 10\n.*train: rows 11: kept 11, dropped 0"),
    Fault("fine-tuning", "truncated .jsonl.gz", lambda e: own_finetune(e, train=truncated_gz(), train_name="train.jsonl.gz"),
          2, r"train\.jsonl\.gz:\d+: unreadable_file: truncated after line \d+ \(EOFError.*repair or re-create it, or "
             r"set finetune\.skip_unreadable=true"),
    Fault("fine-tuning", "truncated .jsonl.gz, skipping opted in",
          lambda e: shown_run(e, "finetune.skip_unreadable=true", train=truncated_gz(), train_name="train.jsonl.gz"),
          0, r"train: rows (\d+): kept \1, dropped 1 \(unreadable_file 1\).*train\.jsonl\.gz:\d+: unreadable_file: "
             r"truncated after line \d+"),
    Fault("fine-tuning", "label column missing (tsv of other headers)",
          lambda e: own_finetune(e, train=b"text\tlabel\nfine day\tpos\n", train_name="train.tsv"),
          2, r"no column 'sentiment': \S+train\.tsv has \['label', 'text'\]\. Set finetune\.task\.label_field"),
    Fault("fine-tuning", "label column missing (parquet)",
          lambda e: own_finetune(e, train=parquet_bytes([{"review": "fine day", "stars": 5}]), train_name="train.parquet"),
          2, r"no column 'sentiment': \S+train\.parquet has \['review', 'stars'\]"),
    Fault("fine-tuning", "semicolon-separated csv",
          lambda e: own_finetune(e, train=REVIEWS.replace(b",", b";")),
          2, r"has \['review;sentiment'\] \('review;sentiment' looks like several column names in one: a \.csv file "
             r"is comma-separated"),
    Fault("fine-tuning", "non-UTF-8 byte in a csv", lambda e: shown_run(e, train=REVIEWS.replace(b"foul", b"f\xe9ul")),
          0, r"train\.csv:3: invalid_utf8: invalid continuation byte at byte 1 of the line"),
]

# ------------------------------------------------------------------ labels by value, files that say what they
# are, user metrics checked at the start, the checkpoint's own tokenizer
def rows_of(values, *, name="train.jsonl") -> dict:
    """REVIEWS' texts with the given label cells, as `own_finetune`'s train and valid files."""
    texts = ["sweet night", "foul day", "noble lord", "vile man"]
    if name.endswith(".csv"):
        data = b"review,sentiment\n" + b"".join(f"{t},{v}\n".encode() for t, v in zip(texts, values))
    else:
        data = b"".join(json.dumps({"review": t, "sentiment": v}).encode() + b"\n" for t, v in zip(texts, values))
    return {"train": data, "valid": data, "train_name": name, "valid_name": name.replace("train", "valid")}


def data_directory(env) -> Path:
    """A split's directory: a csv and a jsonl file of the same columns, and notes beside them."""
    folder = env.tmp / "train_dir"
    env.file("train_dir/a.csv", b"review,sentiment\nsweet night,pos\nfoul day,neg\n")
    env.file("train_dir/b.jsonl", b'{"review": "noble lord", "sentiment": "pos"}\n{"review": "vile man", "sentiment": "neg"}\n')
    env.file("train_dir/NOTES.txt", b"my notes")
    return folder


def user_metric(env, body: str) -> str:
    """`module:score` of a module holding `body`, on the path (a name of its own per row)."""
    import sys
    name = "fault_metric_" + re.sub(r"\W", "_", env.tmp.name)
    env.file(f"metrics/{name}.py", body.encode())
    sys.path.insert(0, str(env.tmp / "metrics"))
    sys.modules.pop(name, None)
    return f"{name}:score"


def finetune_with_tokenizer(env, tokenizer):
    """The own-data fine-tune from the shared run's checkpoints with `data.tokenizer` set."""
    return own_finetune(env, f"finetune.init_from={env.checkpoints()}", f"data.tokenizer={tokenizer}")


UNBALANCED = b"review,sentiment\nsweet night,pos\n\"foul day,neg\nnoble lord,pos\nvile man,neg\n"

FAULTS += [
    Fault("fine-tuning", "labels 0, 1, 0.0 and 1.0 in one csv column are two labels",
          lambda e: shown_run(e, **rows_of(["0", "1", "0.0", "1.0"], name="train.csv")),
          0, r"'sentiment' column: 0: 0, 1: 1\n.*train: rows 4: kept 4, dropped 0"),
    Fault("fine-tuning", "labels 1 and true in one column", lambda e: own_finetune(e, **rows_of([1, True, 0, False])),
          2, r"'sentiment' column mixes kinds of labels \(booleans 'True' x1, 'False' x1; numbers '1' x1, '0' x1\).*"
             r"list every label in finetune\.task\.labels"),
    Fault("fine-tuning", "labels 0 with pos and neg", lambda e: own_finetune(e, **rows_of(["pos", "neg", "0", "pos"],
                                                                                        name="train.csv")),
          2, r"mixes kinds of labels \(names 'pos' x2, 'neg' x1; numbers '0' x1\)"),
    Fault("fine-tuning", "mapping labels", lambda e: own_finetune(e, **rows_of([{"v": "pos"}, {"v": "neg"}] * 2)),
          2, r"the 'sentiment' column holds mappings \(4 rows, e\.g\. \{'v': 'pos'\}\).*set finetune\.task\.label_field"),
    Fault("fine-tuning", "list labels", lambda e: own_finetune(e, **rows_of([["pos"], ["neg", "pos"]] * 2)),
          2, r"the 'sentiment' column holds lists \(4 rows.*set finetune\.task\.problem_type: multi_label_classification"),
    Fault("fine-tuning", "empty training file", lambda e: own_finetune(e, train=b""),
          2, r"the training split has no row to infer labels from: \S+train\.csv: the file is empty"),
    Fault("fine-tuning", "header-only training file", lambda e: own_finetune(e, train=b"review,sentiment\n"),
          2, r"\S+train\.csv: the file holds only a header \(review, sentiment\) and no rows"),
    Fault("fine-tuning", "latin-1 training file",
          lambda e: own_finetune(e, train="review,sentiment\nsw\xe9et night,pos\nf\xe9ul day,neg\n".encode("latin-1")),
          2, r"\S+train\.csv: no row could be read \(invalid_utf8 2\); the file is not UTF-8 \(latin-1 or cp1252\?\): "
             r"save it as UTF-8"),
    Fault("fine-tuning", "all-invalid JSON training file",
          lambda e: own_finetune(e, train=b'{"review": "x", \n{sentiment\n', train_name="train.jsonl"),
          2, r"\S+train\.jsonl: no row could be read \(invalid_json 2\)"),
    Fault("fine-tuning", "a directory of csv and jsonl files, and notes",
          lambda e: shown_run(e, f"finetune.data.train={data_directory(e)}"),
          0, r"train: rows 4: kept 4, dropped 0; truncated: none; ignored 1 file\(s\) of no data format in its "
             r"directories \(\S+NOTES\.txt\)"),
    Fault("fine-tuning", "unbalanced quote in a csv cell", lambda e: own_finetune(e, train=UNBALANCED),
          2, r"train\.csv:3: invalid_row: an unbalanced quote: the quoted cell opened on line 3 runs over 3 lines"),
    Fault("fine-tuning", "unbalanced quote in a tsv cell",
          lambda e: own_finetune(e, train=UNBALANCED.replace(b",", b"\t"), train_name="train.tsv"),
          2, r"train\.tsv:3: invalid_row: an unbalanced quote"),
    Fault("fine-tuning", "user metric of the wrong signature",
          lambda e: own_finetune(e, task={**HEAD, "metrics": ["accuracy", user_metric(e, "def score(p):\n    return 1\n")]}),
          2, r"metric 'fault_metric_\w+:score' fails on a small fake prediction set of kind head .*TypeError"),
    Fault("fine-tuning", "user metric's dict without the selected score",
          lambda e: own_finetune(e, "finetune.select_metric=score", task={**HEAD, "metrics": [user_metric(
              e, "def score(p, r):\n    return {'hits': 1.0}\n")]}),
          2, r"finetune\.select_metric='score' is not a score of task custom: its metrics report \['hits'\]"),
    Fault("fine-tuning", "user metric returning NaN as the selected score",
          lambda e: shown_run(e, "finetune.select_metric=score", task={**HEAD, "metrics": [user_metric(
              e, "def score(p, r):\n    return float('nan')\n")]}),
          2, r"finetune\.select_metric='score' is nan on validation at step \d+: it cannot pick the best checkpoint"),
    Fault("fine-tuning", "data.tokenizer other than init_from's",
          lambda e: finetune_with_tokenizer(e, e.other_tokenizer),
          2, r"data\.tokenizer=\S+ is not the tokenizer finetune\.init_from \S+ was trained with \(\S+\): its SHA-256 "
             r"is \w+\.\.\., the checkpoint recorded \w+\.\.\.; leave data\.tokenizer unset"),
    Fault("checkpoint", "--tokenizer other than the run's, the run's gone (eval)",
          lambda e: evaluate(e, relative_tokenizer(e) / "iter_0000004", tokenizer=str(e.other_tokenizer)),
          ValueError, r"--tokenizer \S+ is not the tokenizer the model was trained with \(tok\): its SHA-256 is"),
    Fault("retrieval", "a fine-tune's unknown qrels document names no flag",
          lambda e: beir(e, qrels="q1\td9\t1\n", skip_unknown_option=None),
          ValueError, r"names 1 document\(s\) that corpus\.jsonl lacks \(e\.g\. \['d9'\]\); fix the qrels or the corpus\Z"),
]

# ------------------------------------------------------------------ a fine-tune's start, its run_dir, retrieval
# data, the shard merge and the launchers: checked before the first step, and a failed start
# leaves no claim (finetune_run.json is .json: the table's "nothing valid-looking" check)
def finished_finetune(env, **kwargs) -> Path:
    """A real fine-tune (2 steps of the own-data head task) in its own folder; its run_dir."""
    run_dir = env.tmp / "done"
    assert own_finetune(env, run_dir=run_dir, **kwargs) == 0
    return run_dir


def pretraining_inside(env) -> Path:
    """Another fine-tune's run_dir that also holds a copy of a pretraining run's checkpoints."""
    folder = other_run(env)
    shutil.copytree(env.run[0], folder / "pretrained")
    return folder


THREE_LABELS = REVIEWS + b"plain stone,mid\nbare wall,mid\n"
NO_PRETRAINING_ADVICE = r"\A(?!.*checkpoint\.load)"  # an init_from refusal never sends the user to checkpoint.load


def beir(env, corpus=({"_id": "d1", "text": "red apples"},), queries=({"_id": "q1", "text": "fruit"},),
         qrels="q1\td1\t1\n", **options):
    from megatron_biglm.finetune.retrieval.beir import load_beir
    folder = env.tmp / "beir"
    env.file("beir/corpus.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in corpus))
    env.file("beir/queries.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in queries))
    env.file("beir/qrels/test.tsv", qrels.encode())
    return load_beir(folder, **options)


def eval_retrieval(env, *args):
    from megatron_biglm.cli.eval_retrieval import main
    beir(env)
    try:
        return main(["--data", str(env.tmp / "beir"), "--output", str(env.out / "r.json"), *args])
    except SystemExit as exited:  # argparse's refusal
        return exited.code


def subprocess_status(argv, **env_vars):
    """A real subprocess; its stderr is replayed on ours (the table reads it there)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(argv, capture_output=True, text=True, env={**env, **env_vars}, timeout=120)
    sys.stderr.write(done.stderr)
    return done.returncode


def stale_merge(env):
    """launch/preprocess.sh's work for one shard, then its input edited before the merge."""
    from megatron_biglm.cli.merge_datasets import main as merge
    from megatron_biglm.cli.preprocess_shards import main as shards
    corpus = env.file("corpus/c.jsonl", b'{"text": "sweet night"}\n')
    assert shards(["--input", str(corpus), "--shards", "1", "--tokenizer", env.tokenizer,
                   "--out", str(env.tmp / "shards"), "--task", "all"]) == 0
    corpus.write_bytes(b'{"text": "sweet night, foul day"}\n')
    return merge(["--shards", str(env.tmp / "shards"), "--output-prefix", str(env.out / "merged")])


def relative_tokenizer(env) -> Path:
    """The run's checkpoints as a run saved them before tokenizer paths were pinned: the
    config says `data.tokenizer: tok`, relative to wherever that run was launched (the file
    keeps its size, as the manifest records it)."""
    root = env.checkpoints()
    for config in root.glob("iter_*/config.yaml"):
        text = config.read_text()
        config.write_text(text.replace(f"tokenizer: {env.tokenizer}\n",
                                       "tokenizer: tok" + " " * (len(env.tokenizer) - 3) + "\n"))
        assert config.read_text() != text and len(config.read_text()) == len(text)
    return root


def edited_tokenizer(env) -> Path:
    """The run's checkpoints naming a copy of their tokenizer (`tok` beside them) that was
    edited after training."""
    root = relative_tokenizer(env)
    shutil.copytree(env.tokenizer, env.tmp / "tok")
    config = env.tmp / "tok" / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 7}))
    return root


def finetune_from(env, start, run_dir=None):
    """The own-data fine-tune from `start` with no data.tokenizer: the start's own is used."""
    import yaml

    from megatron_biglm.cli.finetune import main
    files = {"train": str(env.file("train.csv", REVIEWS)), "validation": str(env.file("valid.csv", REVIEWS))}
    config = env.file("from_start.yaml", yaml.safe_dump({
        "run_dir": str(run_dir or env.out / "ft"), "training": {"micro_batch_size": 2, "global_batch_size": 2},
        "finetune": {"task": HEAD, "data": files, "init_from": str(start), "max_length": 16, "epochs": 1}}).encode())
    return main(["--config", str(config)])


def two_ctrl_c(env):
    import sys
    from second_ctrl_c import SCRIPT
    return subprocess_status([sys.executable, "-c", SCRIPT])


FAULTS += [
    Fault("fine-tuning", "training file changed before the rerun",
          lambda e: own_finetune(e, train=REVIEWS + b"kind soul,pos\n", run_dir=finished_finetune(e)),
          2, r"finetune\.data\.train: \S+train\.csv changed since that run started \(\d+ bytes there, \d+ here.*"
             r"its own run_dir, or set finetune\.overwrite=true"),
    Fault("fine-tuning", "overwrite a run_dir that is init_from",
          lambda e: own_finetune(e, "finetune.overwrite=true", f"finetune.init_from={e.checkpoints()}",
                                 run_dir=e.checkpoints()),
          2, r"finetune\.overwrite: run_dir \S+ holds finetune\.init_from=\S+, the checkpoint this run starts from"),
    Fault("fine-tuning", "overwrite a run_dir holding a pretraining checkpoint",
          lambda e: own_finetune(e, "finetune.overwrite=true", run_dir=pretraining_inside(e)),
          2, r"finetune\.overwrite: run_dir \S+ holds a pretraining checkpoint \(\S+pretrained/iter_\d+\)"),
    Fault("fine-tuning", "bad batch arithmetic leaves no claim", lambda e: own_finetune(e, "training.global_batch_size=3"),
          2, r"pick a global batch that is a multiple of 2"),
    Fault("fine-tuning", "missing init_from", lambda e: own_finetune(e, f"finetune.init_from={e.tmp / 'nowhere'}"),
          2, r"finetune\.init_from: checkpoint \S+nowhere does not exist; set finetune\.init_from to a checkpoint"),
    Fault("fine-tuning", "corrupt init_from leaves no claim", lambda e: own_finetune(e, f"finetune.init_from={damaged(e)}"),
          2, NO_PRETRAINING_ADVICE + r".*fail their CRC-32.*start from the previous checkpoint: `finetune\.init_from=\S+iter_0000002`"),
    Fault("fine-tuning", "truncated init_from", lambda e: own_finetune(e, f"finetune.init_from={truncated(e)}"),
          2, NO_PRETRAINING_ADVICE + r".*is truncated.*Point finetune\.init_from at an earlier complete checkpoint: "
                                     r"`finetune\.init_from=\S+iter_0000002`"),
    Fault("fine-tuning", "typo'd select_metric", lambda e: own_finetune(e, "finetune.select_metric=acuracy"),
          2, r"finetune\.select_metric='acuracy' is not a score of task \S+ \(did you mean 'accuracy'\?\)"),
    Fault("fine-tuning", "user metric that does not import",
          lambda e: own_finetune(e, task={**HEAD, "metrics": ["accuracy", "nosuchmetricmodule:score"]}),
          2, r"metric 'nosuchmetricmodule:score': cannot import score from nosuchmetricmodule.*PYTHONPATH"),
    Fault("fine-tuning", "learning rate 0", lambda e: own_finetune(e, "optimizer.lr=0", "optimizer.min_lr=0"),
          2, r"'optimizer\.lr' must be > 0, got 0"),
    Fault("fine-tuning", "head of another label count in init_from",
          lambda e: own_finetune(e, f"finetune.init_from={finished_finetune(e)}", train=THREE_LABELS, valid=THREE_LABELS),
          2, r"holds a head of another shape: task_head\.\S+ is \[2, \d+\] there, \[3, \d+\] here.*"
             r"Set finetune\.reinit_mismatched_heads=true to start that head fresh"),
    Fault("fine-tuning", "relative tokenizer in init_from, found nowhere",
          lambda e: finetune_from(e, relative_tokenizer(e)),
          2, r"data\.tokenizer: the tokenizer 'tok' saved with finetune\.init_from \S+ is not a directory beside its "
             r"config.*set data\.tokenizer=DIR"),
    Fault("fine-tuning", "init_from's tokenizer changed since it was trained",
          lambda e: finetune_from(e, edited_tokenizer(e)),
          2, r"data\.tokenizer: the tokenizer saved with finetune\.init_from \S+, \S+/tok is not the tokenizer the "
             r"model was trained with: its files changed since"),
    Fault("checkpoint", "tokenizer changed since training (export)", lambda e: export(e, edited_tokenizer(e)),
          1, r"data\.tokenizer of the saved run config, \S+/tok is not the tokenizer the model was trained with: "
             r"its files changed since"),
    Fault("retrieval", "repeated document id", lambda e: beir(e, corpus=[{"_id": "d1", "text": "a"}, {"_id": "d1", "text": "b"}]),
          ValueError, r"corpus\.jsonl:2: _id 'd1' is already the id of line 1.*--keep-first-duplicate"),
    Fault("retrieval", "fractional relevance grade", lambda e: beir(e, qrels="q1\td1\t0.5\n"),
          ValueError, r"qrels/test\.tsv:1: relevance '0\.5' is not a whole number"),
    Fault("retrieval", "empty queries file", lambda e: beir(e, queries=[]),
          ValueError, r"queries\.jsonl holds no query"),
    Fault("retrieval", "batch size 0", lambda e: eval_retrieval(e, "--model", str(e.tmp), "--batch-size", "0"),
          2, r"--batch-size: '0' is not a whole number >= 1"),
    Fault("retrieval", "missing model", lambda e: eval_retrieval(e, "--model", str(e.tmp / "no_model")),
          1, r"--model \S+no_model does not exist"),
    Fault("corpus", "input edited before the shard merge", stale_merge,
          1, r"1 stale shard\(s\).*shard_00000: \S+c\.jsonl changed since it was preprocessed.*"
             r"Re-submit the array.*--allow-stale"),
    Fault("launch", "python without the package (preprocess.sh)",
          lambda e: subprocess_status(["bash", str(Path(__file__).resolve().parents[2] / "launch" / "preprocess.sh")],
                                      PYTHON="/usr/bin/python3", DRY_RUN="1", SHARDS="2", INPUT=str(e.tmp)),
          2, r"PYTHON=/usr/bin/python3 cannot import megatron_biglm \(.*\); set PYTHON to the python"),
    Fault("training", "two quick Ctrl-C", two_ctrl_c,
          130, r"\Asecond Ctrl-C: stopped without saving; the last sealed checkpoint is kept\n\Z"),
]

# ------------------------------------------------------------------ run directories, saving, values
def with_notes(env) -> Path:
    """A finished fine-tune's run_dir where the user also keeps notes and an earlier fine-tune."""
    run_dir = finished_finetune(env)
    (run_dir / "NOTES.txt").write_text("what I tried")
    shutil.copytree(finished_finetune_copy(env, run_dir), run_dir / "earlier")
    return run_dir


def finished_finetune_copy(env, run_dir) -> Path:
    """A copy of `run_dir` beside it (a complete fine-tune: checkpoints, best, results.json)."""
    copy = env.tmp / "copy"
    shutil.copytree(run_dir, copy)
    return copy


def held(env, *overrides):
    """The own-data fine-tune while another process's lock holds its run_dir (a flock on
    run.lock through another open file, as another process takes it)."""
    import fcntl
    import os
    run_dir = env.tmp / "busy"
    run_dir.mkdir()
    fd = os.open(run_dir / "run.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, json.dumps({"host": "node7", "pid": 4242, "started": "2026-01-01T00:00:00+00:00"}).encode())
    try:
        return own_finetune(env, *overrides, run_dir=run_dir)
    finally:
        os.close(fd)


def duplicate_key(env):
    from megatron_biglm.cli.train import main
    config = env.file("dup.yaml", b"optimizer:\n  lr: 0.001\ntraining:\n  seed: 1\noptimizer:\n  min_lr: 0.0001\n")
    return main(["--config", str(config), f"run_dir={env.out / 'run'}"])


def every_step_nan(env):
    """A 3-step pretraining (fewer than training.max_nonfinite_in_a_row) whose every loss is NaN
    (it raises `TooManyNonFinite`, a RuntimeError; the CLI exits 3 on it)."""
    from train_fixtures import poisoned_train
    return poisoned_train(env.config, [f"run_dir={env.tmp / 'nan'}", "schedule.train_steps=3", "schedule.warmup_steps=1",
                                       "checkpoint.save_interval=100"], lambda step, out: out * float("nan"))


FAULTS += [
    Fault("fine-tuning", "overwrite a run_dir holding the user's notes and an earlier fine-tune",
          lambda e: own_finetune(e, "finetune.overwrite=true", "finetune.epochs=2", run_dir=with_notes(e)),
          2, r"finetune\.overwrite: run_dir \S+ holds what no run wrote there: NOTES\.txt, earlier/ \(a fine-tune "
             r"nested there\); nothing was deleted"),
    Fault("fine-tuning", "run_dir holding the run's own data files", lambda e: own_finetune(e, run_dir=e.tmp),
          2, r"run_dir \S+ holds this run's own input files \(finetune\.data\.train=\S+train\.csv, "
             r"finetune\.data\.validation=\S+valid\.csv\)"),
    Fault("fine-tuning", "run_dir is init_from", lambda e: own_finetune(e, f"finetune.init_from={e.checkpoints()}",
                                                                        run_dir=e.checkpoints()),
          2, r"run_dir and finetune\.init_from are the same path"),
    Fault("fine-tuning", "run_dir is a file", lambda e: own_finetune(e, run_dir=e.file("afile", b"x")),
          2, r"\Aerror: run_dir \S+afile: \S+afile is a file, not a folder; remove it or choose another run_dir\n\Z"),
    Fault("fine-tuning", "run_dir in use by another run", held,
          2, r"\Aerror: run_dir \S+busy is in use by another run \(pid 4242 on node7, started 2026-01-01T00:00:00\+00:00\)"),
    Fault("fine-tuning", "resume with another schedule", lambda e: own_finetune(e, "finetune.schedule=cosine",
                                                                                 run_dir=finished_finetune(e)),
          2, r"finetune\.schedule: 'linear' there, 'cosine' here.*finetune\.resume_changes=\[finetune\.schedule\]"),
    Fault("fine-tuning", "resume with another weight decay", lambda e: own_finetune(e, "optimizer.weight_decay=0.3",
                                                                                     run_dir=finished_finetune(e)),
          2, r"optimizer\.weight_decay: 0\.01 there, 0\.3 here"),
    Fault("fine-tuning", "max_length past the model", lambda e: own_finetune(e, "finetune.max_length=600"),
          2, r"\Aerror: finetune\.max_length=600 exceeds the model's maximum model\.seq_length=\d+; lower "
             r"finetune\.max_length"),
    Fault("config", "learning rate inf", lambda e: own_finetune(e, "optimizer.lr=inf"),
          2, r"config key 'optimizer\.lr': 'inf' is not a finite number"),
    Fault("config", "learning rate nan", lambda e: own_finetune(e, "optimizer.lr=nan"),
          2, r"config key 'optimizer\.lr': 'nan' is not a finite number"),
    Fault("config", "a key written twice", duplicate_key,
          2, r"config file \S+dup\.yaml: key 'optimizer' is written twice in one mapping, at line 1 and line 5"),
    Fault("training", "every step non-finite", every_step_nan,
          RuntimeError, r"the loss was NaN/inf at every one of the run's 3 steps"),
]


# ------------------------------------------------------------------ zero-shot and generate arguments, checked before
# the model loads (a damaged checkpoint would be named if it loaded first); retrieval's empty texts
def zero_shot_main(argv):
    from megatron_biglm.cli.eval_zero_shot import main
    return main(argv)


def zero_shot(env, *argv, path=None, model_args=",progress=false"):
    return zero_shot_main(["--model", "biglm", "--model-args", f"path={path or env.run[0]}{model_args}",
                           "--task-dir", str(env.tmp / "tasks"), *argv])


def generate_cli(env, *argv):
    from megatron_biglm.cli.generate import main
    return main(["--model", str(env.run[0]), "--prompt", "sweet night", "--length", "2", "--no-progress", *argv])


def argparse_status(entry, *args):
    try:
        return entry(*args)
    except SystemExit as exited:  # argparse's refusal
        return exited.code


def retrieval_notes(env, corpus, queries, qrels):
    """biglm-eval-retrieval of the tiny pretraining checkpoint on a folder with empty texts (it runs: exit 0)."""
    from megatron_biglm.cli.eval_retrieval import main
    beir(env, corpus=corpus, queries=queries, qrels=qrels)
    return main(["--model", str(env.run[0]), "--data", str(env.tmp / "beir"), "--output", str(env.tmp / "r.json"),
                 "--cache-dir", "", "--quiet"])


DOCS = ({"_id": "d1", "text": "red apples"}, {"_id": "d2", "text": "green pears"})
FAULTS += [
    Fault("eval data", "typo'd --suite, before the model loads",
          lambda e: zero_shot(e, "--suite", "arc_esy", path=damaged(e) / "iter_0000004"),
          1, r"--suite: lm-eval has no task, group or tag 'arc_esy' \(did you mean 'arc_easy'\?\)"),
    Fault("eval data", "typo'd --suite with --data-dir",
          lambda e: zero_shot(e, "--suite", "hellaswg", "--data-dir", str(e.tmp)),
          1, r"--suite: lm-eval has no built-in task 'hellaswg' \(did you mean 'hellaswag'\?\)"),
    Fault("eval data", "scoring=bogus", lambda e: zero_shot(e, "--suite", "arc_easy", model_args=",scoring=bogus",
                                                            path=damaged(e) / "iter_0000004"),
          1, r"--model-args: scoring='bogus' is not a scoring rule; choose one of beam, oneshot, pll"),
    Fault("eval data", "--model-args PATH without key=",
          lambda e: zero_shot_main(["--model", "biglm", "--model-args", str(e.run[0]), "--suite", "arc_easy"]),
          1, r"--model-args: '\S+' is not key=value; write e\.g\. path=\S+"),
    Fault("eval data", "--limit 0", lambda e: zero_shot(e, "--suite", "arc_easy", "--limit", "0",
                                                        path=damaged(e) / "iter_0000004"),
          1, r"--limit 0 scores no document; give a number of documents per task \(>= 1\)"),
    Fault("eval data", "--output a directory", lambda e: zero_shot(e, "--suite", "arc_easy", "--output", str(e.tmp),
                                                                   path=damaged(e) / "iter_0000004"),
          1, r"--output \S+ is a directory; give a file path"),
    Fault("eval data", "answerKey outside the labels", lambda e: eval_cli(e, "arc_easy", [ARC, {**ARC, "answerKey": "E"}]),
          1, r"arc_easy\.jsonl:2: arc_easy row's answerKey: answerKey 'E' is not among its labels \['A', 'B'\]"),
    Fault("eval data", "one choice text, two labels",
          lambda e: eval_cli(e, "arc_easy", [{**ARC, "choices": {"text": ["red"], "label": ["A", "B"]}}]),
          1, r"arc_easy\.jsonl:1: arc_easy row has 1 choice text\(s\) in choices\.text but 2 label\(s\)"),
    Fault("eval data", "label past the endings", lambda e: eval_cli(e, "hellaswag", [
        {"ctx": "He", "activity_label": "Run", "endings": ["runs", "sits"], "label": "2"}]),
          1, r"hellaswag\.jsonl:1: hellaswag row's label: '2' names none of its 2 choices"),
    Fault("generation", "--output a directory", lambda e: generate_cli(e, "--output", str(e.tmp)),
          2, r"--output \S+ is a directory; give a file path"),
    Fault("tokenizer", "case typo in --tokenizer-type",
          lambda e: argparse_status(preprocess, e, e.file("c.jsonl", b'{"text": "x"}\n'),
                                    "--tokenizer-type", "huggingfacetokenizer"),
          2, r"--tokenizer-type huggingfacetokenizer: did you mean HuggingFaceTokenizer\?"),
    Fault("retrieval", "empty query text is skipped and noted",
          lambda e: retrieval_notes(e, DOCS, [{"_id": "q1", "text": "fruit"}, {"_id": "q2", "text": "  "}],
                                    "q1\td1\t1\nq2\td2\t1\n"),
          0, r"note: beir: queries\.jsonl: 1 query\(ies\) with empty text skipped \(line\(s\) 2\)"),
    Fault("retrieval", "empty document text is skipped and noted",
          lambda e: retrieval_notes(e, [*DOCS, {"_id": "d3", "text": ""}], [{"_id": "q1", "text": "fruit"}],
                                    "q1\td1\t1\nq1\td3\t1\n"),
          0, r"note: beir: corpus\.jsonl: 1 document\(s\) with empty text skipped \(line\(s\) 3\).*"
             r"qrels/test\.tsv: 1 judgment\(s\) of documents with empty text left out"),
]

def test_what_the_start_refusals_leave_possible(saved_run, other_tokenizer, tmp_path, capsys):  # noqa: F811
    """The other side of the rows above: the corrected rerun of a failed start runs in the same
    run_dir (no claim was left); `finetune.reinit_mismatched_heads=true` starts a head of
    another size fresh, with a note; `finetune.overwrite=true` deletes a fine-tune's own
    run_dir, not what it starts from."""
    env = Env(tmp_path, saved_run, other_tokenizer, [])
    run_dir = env.out / "ft"
    assert own_finetune(env, "training.global_batch_size=3", run_dir=run_dir) == 2
    assert own_finetune(env, run_dir=run_dir) == 0
    assert json.loads((run_dir / "finetune_run.json").read_text())["data_content"]["train"]
    three = tmp_path / "three"
    assert own_finetune(env, f"finetune.init_from={run_dir}", "finetune.reinit_mismatched_heads=true",
                        train=THREE_LABELS, valid=THREE_LABELS, run_dir=three) == 0
    out = capsys.readouterr().out
    assert re.search(r"finetune\.reinit_mismatched_heads: freshly initialised, as the stored shape differs: "
                     r"task_head\.\S+ is \[2, \d+\] there, \[3, \d+\] here", out), out
    assert json.loads((three / "results.json").read_text())["finished"]
    assert own_finetune(env, "finetune.overwrite=true", "finetune.epochs=2", run_dir=run_dir) == 0
    assert "finetune.overwrite: deleted the other run in" in capsys.readouterr().out
    assert json.loads((run_dir / "finetune_run.json").read_text())["epochs"] == 2


def test_a_relative_tokenizer_saved_in_a_checkpoint_is_found_beside_it_from_another_directory(
        saved_run, other_tokenizer, tmp_path, capsys, monkeypatch):  # noqa: F811
    """A checkpoint whose config says `data.tokenizer: tok` (relative to where its run was
    launched) fine-tunes from another working directory: the tokenizer is found in a folder
    above the checkpoint; the fine-tune saves the absolute path it used."""
    env = Env(tmp_path, saved_run, other_tokenizer, [])
    root = relative_tokenizer(env)
    shutil.copytree(env.tokenizer, tmp_path / "tok")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert finetune_from(env, root) == 0
    assert f"its tokenizer {tmp_path / 'tok'}" in capsys.readouterr().out
    import yaml
    saved = yaml.safe_load((env.out / "ft" / "config.yaml").read_text())
    assert saved["data"]["tokenizer"] == str(tmp_path / "tok")


_VALID_LOOKING = {".bin", ".idx", ".safetensors", ".json", ".yaml", ".distcp"}


@pytest.fixture(scope="module")
def other_tokenizer(tokenizer_dir):
    return tokenizer_dir


@pytest.mark.parametrize("fault", FAULTS, ids=[f"{f.area}: {f.name}" for f in FAULTS])
def test_fault(fault, saved_run, other_tokenizer, tmp_path):  # noqa: F811
    env = Env(tmp_path, saved_run, other_tokenizer, [])
    env.out.mkdir()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        if isinstance(fault.expect, int):  # a CLI: its exit status, its message on stderr
            status = fault.act(env)
            message = err.getvalue()
            assert status == fault.expect, message
        else:
            with pytest.raises(fault.expect) as raised:
                fault.act(env)
            message = str(raised.value)
    assert re.search(fault.says, message, re.DOTALL), message
    written = [p for p in env.out.rglob("*") if p.is_file() and (p.suffix in _VALID_LOOKING or p.name == "latest")]
    assert not written, f"{fault.name} left {written}"
    for root in env.copies:  # the damaged copy: no new checkpoint, `latest` not moved
        names = sorted(p.name for p in root.iterdir())
        assert names == ["iter_0000002", "iter_0000004", "latest"], names
        assert (root / "latest").read_text().strip() == "iter_0000004"


def test_the_matrix_has_at_least_20_rows_over_every_area():
    assert len(FAULTS) >= 20
    assert {f.area for f in FAULTS} >= {"corpus", "tokenizer", "indexed data", "config", "checkpoint",
                                        "eval data", "generation", "fine-tuning"}
