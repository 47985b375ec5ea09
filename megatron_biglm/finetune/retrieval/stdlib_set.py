"""An offline, real retrieval set from the Python standard library's docstrings.

Query: a public function's one-line summary; passage: the rest of its docstring (the
summary removed, so a query is never a substring of its own passage). Every installed
Python has the text, so tests and demos need no download. Deterministic for one Python
version: the modules are a fixed list, functions are visited in sorted order, duplicates
(same summary or same body) are dropped, and a pair lands in train or test by a hash of its
qualified name. Written as BEIR-format folders (corpus.jsonl, queries.jsonl,
qrels/<split>.tsv) plus a `train.jsonl` of {"query", "positive"} pairs for the recipe.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
from pathlib import Path

MODULES = ("os", "os.path", "shutil", "string", "textwrap", "re", "json", "math", "statistics",
           "random", "itertools", "functools", "operator", "collections", "heapq", "bisect",
           "datetime", "calendar", "time", "pathlib", "glob", "fnmatch", "tempfile", "zipfile",
           "tarfile", "gzip", "csv", "base64", "binascii", "hashlib", "hmac", "secrets", "uuid",
           "urllib.parse", "html", "email.utils", "socket", "subprocess", "threading", "queue",
           "inspect", "ast", "dis", "tokenize", "types", "typing", "copy", "pprint", "difflib",
           "unicodedata", "locale", "gettext", "logging", "warnings", "contextlib", "abc",
           "struct", "codecs", "io", "pickle", "shelve", "sqlite3", "decimal", "fractions",
           "cmath", "colorsys", "wave", "platform", "sysconfig", "traceback", "weakref",
           "ipaddress", "mimetypes", "quopri", "uu", "zlib", "bz2", "lzma", "configparser",
           "argparse", "getopt", "shlex", "filecmp", "stat", "linecache", "keyword", "numbers")


def docstring_pairs(min_body_chars: int = 40, max_body_chars: int = 600) -> list[dict]:
    """[{"id", "query", "passage"}] sorted by id, from the modules above that import here."""
    pairs, seen = [], set()
    for module_name in MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            lines = doc.strip().splitlines()
            if len(lines) < 2:
                continue
            query = lines[0].strip()
            body = " ".join(" ".join(lines[1:]).split())[:max_body_chars]
            if len(query) < 12 or len(body) < min_body_chars or query in seen or body in seen:
                continue
            seen.update((query, body))
            pairs.append({"id": f"{module_name}.{name}", "query": query, "passage": body})
    return sorted(pairs, key=lambda p: p["id"])


def split_of(pair_id: str, test_fraction: float) -> str:
    digest = int(hashlib.sha256(pair_id.encode()).hexdigest()[:8], 16)
    return "test" if digest / 0xFFFFFFFF < test_fraction else "train"


def write_beir(pairs: list[dict], out_dir, split: str = "test") -> Path:
    """One BEIR folder: every pair's passage is a corpus document, its query the query."""
    out = Path(out_dir)
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w") as corpus, open(out / "queries.jsonl", "w") as queries, \
            open(out / "qrels" / f"{split}.tsv", "w") as qrels:
        qrels.write("query-id\tcorpus-id\tscore\n")
        for p in pairs:
            corpus.write(json.dumps({"_id": "d:" + p["id"], "title": "", "text": p["passage"]}) + "\n")
            queries.write(json.dumps({"_id": "q:" + p["id"], "text": p["query"]}) + "\n")
            qrels.write(f"q:{p['id']}\td:{p['id']}\t1\n")
    return out


def build_stdlib_set(out_dir, test_fraction: float = 0.25, limit: int | None = None) -> dict:
    """Write out_dir/train.jsonl (pairs) and out_dir/stdlib_test (a BEIR folder); the counts.
    `limit`: keep the first `limit` pairs (by id) only, for fast tests."""
    pairs = docstring_pairs()[:limit]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train = [p for p in pairs if split_of(p["id"], test_fraction) == "train"]
    test = [p for p in pairs if split_of(p["id"], test_fraction) == "test"]
    with open(out / "train.jsonl", "w") as fh:
        for p in train:
            fh.write(json.dumps({"query": p["query"], "positive": p["passage"]}) + "\n")
    write_beir(test, out / "stdlib_test")
    return {"train": len(train), "test": len(test), "train_file": str(out / "train.jsonl"),
            "beir_dir": str(out / "stdlib_test")}
