"""tools/: Megatron-LM's scripts, run from a checkout as its README writes them.

Each script only puts the checkout first on sys.path and runs a `cli/` command; these tests
run them as real subprocesses with the relative path a README gives (`python tools/X.py`,
from the checkout's root, with no PYTHONPATH) and compare what they write with the
`biglm-*` command run in this process.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convert_fixtures import hf_state, random_eurobert_source
from preprocess_fixtures import REPO, bpe, bpe_dir, load_tool, read_back  # noqa: F401

TOOLS = ("preprocess_data", "convert_checkpoint", "merge_datasets")


def _run_tool(name: str, *args) -> subprocess.CompletedProcess:
    """`python tools/NAME.py ARGS` from the checkout's root, with no PYTHONPATH set."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, f"tools/{name}.py", *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


def _same_bytes(a: Path, b: Path) -> None:
    for suffix in (".bin", ".idx"):
        left, right = Path(f"{a}{suffix}").read_bytes(), Path(f"{b}{suffix}").read_bytes()
        assert left == right, f"{a}{suffix} differs from {b}{suffix}"


def test_every_tool_runs_the_checkout_package(tmp_path):
    """From any working directory and without PYTHONPATH, a tool imports the package of the
    checkout it sits in (not another installed copy), and names a cli/ command."""
    probe = ("import runpy, sys\n"
             f"for name in {TOOLS!r}:\n"
             f"    scope = runpy.run_path({str(REPO)!r} + f'/tools/{{name}}.py', run_name='probe')\n"
             "    print(name, scope['main'].__module__, sys.modules[scope['main'].__module__].__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines()]
    assert [row[0] for row in rows] == list(TOOLS)
    assert [row[1] for row in rows] == ["megatron_biglm.cli.preprocess", "megatron_biglm.cli.convert",
                                        "megatron_biglm.cli.merge_datasets"]
    for _, _, path in rows:
        assert Path(path).resolve().is_relative_to(REPO / "megatron_biglm" / "cli"), path


def test_preprocess_data_with_megatron_flags_writes_the_bytes_of_biglm_preprocess(corpus_jsonl, bpe_dir,
                                                                                 tmp_path):
    proc = _run_tool("preprocess_data", "--input", corpus_jsonl, "--output-prefix", tmp_path / "megatron",
                     "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", bpe_dir,
                     "--json-keys", "text", "--workers", 2, "--append-eod")
    assert proc.returncode == 0, proc.stderr
    rc = load_tool("preprocess").main(["--input", str(corpus_jsonl), "--output-prefix", str(tmp_path / "ours"),
                                       "--tokenizer", str(bpe_dir), "--append-eod", "--quiet"])
    assert rc == 0
    _same_bytes(tmp_path / "megatron_text_document", tmp_path / "ours_text_document")
    assert len(read_back(tmp_path / "ours_text_document")) > 10


@pytest.mark.parametrize("flags, named", [
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "gpt2-vocab.json", "--merge-file",
      "gpt2-merges.txt"], ["GPT2BPETokenizer", "GPT2TokenizerFast", "--tokenizer-type HuggingFaceTokenizer"]),
    (["--vocab-file", "vocab.txt", "--tokenizer-model", "tok/"], ["--vocab-file", "BertTokenizerFast"]),
    (["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", "tokenizer.model"],
     ["SentencePieceTokenizer", "save_pretrained", "biglm-train-tokenizer"]),
    (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok/", "--split-sentences"],
     ["--split-sentences", "leave the flag out"]),
    (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok/", "--partitions", "4"],
     ["--partitions 4", "--workers N", "biglm-preprocess-shards"]),
    (["--tokenizer-type", "HuggingFaceTokenizer"], ["--tokenizer (or --tokenizer-model)"]),
])
def test_megatron_flags_we_do_not_support_are_refused_naming_the_alternative(flags, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_tool("preprocess").main(["--input", str(tmp_path / "c.jsonl"), "--output-prefix",
                                      str(tmp_path / "out"), "--workers", "1", *flags])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err
    for text in named:
        assert text in message, (text, message)
    assert not list(tmp_path.iterdir())  # refused before anything was read or written


def test_merge_datasets_tool_writes_the_bytes_of_biglm_merge_datasets(corpus_jsonl, bpe_dir, tmp_path):
    lines = Path(corpus_jsonl).read_text("utf-8").splitlines(keepends=True)
    preprocess = load_tool("preprocess").main
    for part, rows in (("a", lines[: len(lines) // 2]), ("b", lines[len(lines) // 2:])):
        (tmp_path / f"{part}.jsonl").write_text("".join(rows), "utf-8")
        assert preprocess(["--input", str(tmp_path / f"{part}.jsonl"), "--output-prefix", str(tmp_path / part),
                           "--tokenizer", str(bpe_dir), "--quiet"]) == 0
    parts = [tmp_path / "a_text_document", tmp_path / "b_text_document"]
    proc = _run_tool("merge_datasets", "--input", *parts, "--output-prefix", tmp_path / "tool")
    assert proc.returncode == 0, proc.stderr
    assert load_tool("merge_datasets").main(["--input", *map(str, parts), "--output-prefix",
                                             str(tmp_path / "ours")]) == 0
    _same_bytes(tmp_path / "tool", tmp_path / "ours")
    assert read_back(tmp_path / "tool") == read_back(parts[0]) + read_back(parts[1])


@pytest.mark.slow  # two conversions in a subprocess importing megatron-core and transformers
def test_convert_checkpoint_tool_round_trips_an_hf_model(tokenizer_dir, tmp_path_factory, tmp_path):
    import torch

    source = random_eurobert_source(tokenizer_dir, tmp_path_factory, seed=3)
    proc = _run_tool("convert_checkpoint", "from-hf", "--hf", source, "--output", tmp_path / "ckpt", "--quiet")
    assert proc.returncode == 0, proc.stderr
    proc = _run_tool("convert_checkpoint", "to-hf", "--checkpoint", tmp_path / "ckpt", "--output",
                     tmp_path / "back", "--quiet")
    assert proc.returncode == 0, proc.stderr
    before, after = hf_state(source), hf_state(tmp_path / "back")
    assert sorted(before) == sorted(after)
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name
    proc = _run_tool("convert_checkpoint", "to-hf", "--checkpoint", tmp_path / "missing", "--output",
                     tmp_path / "none")
    assert proc.returncode == 1 and "missing" in proc.stderr and not (tmp_path / "none").exists()
