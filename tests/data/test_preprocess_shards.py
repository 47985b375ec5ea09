"""Sharded preprocessing (launch/preprocess.sh): 4 shards merged are byte for byte one
process's output; the blend holds the same tokens; a killed or stale shard is redone and
nothing stale is merged; the plan is contiguous and balanced by bytes."""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from preprocess_fixtures import load_tool

REPO = Path(__file__).resolve().parents[2]
# Lines per part: six files of different sizes (the sample corpus has ~50 scenes).
PART_LINES = (3, 11, 2, 9, 14)
BAD_LINE = '{"text": "unterminated\n'


@pytest.fixture(scope="module")
def parts(corpus_jsonl, tmp_path_factory) -> Path:
    """The Shakespeare sample split into 6 jsonl files, the third holding one invalid line."""
    lines = Path(corpus_jsonl).read_text("utf-8").splitlines(keepends=True)
    folder = tmp_path_factory.mktemp("parts")
    start = 0
    for i, n in enumerate(PART_LINES + (len(lines),)):
        chunk = lines[start:start + n]
        start += n
        if i == 2:
            chunk.insert(1, BAD_LINE)
        (folder / f"part_{i}.jsonl").write_text("".join(chunk), encoding="utf-8")
    assert start >= len(lines)
    return folder


def _launch(parts_dir: Path, tokenizer, out: Path, **env) -> subprocess.Popen:
    """Start `bash launch/preprocess.sh` over the parts with these settings."""
    full = {**os.environ, "PYTHON": sys.executable, "INPUT": str(parts_dir / "*.jsonl"),
            "TOKENIZER": str(tokenizer), "OUT": str(out), "SHARDS": "4",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            **env}
    for key in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_CPUS_PER_TASK"):
        full.pop(key, None)
    return subprocess.Popen(["bash", str(REPO / "launch" / "preprocess.sh")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full, cwd=REPO)


def _finish(proc: subprocess.Popen) -> str:
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout


@pytest.fixture(scope="module")
def runs(parts, tokenizer_dir, tmp_path_factory):
    """One process over all parts, and 4 shards made by `LOCAL=1 SHARDS=4` preprocess.sh."""
    from megatron_biglm.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("runs")
    proc = _launch(parts, tokenizer_dir, root / "shards", LOCAL="1")  # runs beside the next line
    single = preprocess([str(parts / "*.jsonl")], str(root / "single"), tokenizer_dir, append_eod=True)
    return root, single, _finish(proc)


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_plan_is_contiguous_balanced_and_dry_run_prints_it(parts, tokenizer_dir, tmp_path):
    from megatron_biglm.data.shards import InputFile, ShardError, plan_shards

    files = [InputFile(f"f{i}", size, 0) for i, size in enumerate([5, 1, 1, 1, 9, 2, 2, 3])]
    plan = plan_shards(files, 3)
    assert [f for run in plan.files for f in run] == files  # contiguous, in order, all files
    assert [plan.shard_bytes(k) for k in range(3)] == [8, 9, 7]  # the smallest possible max
    assert [len(run) for run in plan_shards(files, 8).files] == [1] * 8
    with pytest.raises(ShardError, match="only 8 input files"):
        plan_shards(files, 9)

    rng = random.Random(0)
    for _ in range(200):  # against the reference: every way to cut the files, the best max
        sizes = [rng.choice([0, 1, 2, 3, 5, 8, 13, 40]) for _ in range(rng.randint(1, 9))]
        n = rng.randint(1, len(sizes))
        plan = plan_shards([InputFile(f"f{i}", size, 0) for i, size in enumerate(sizes)], n)
        assert plan.shards == n and all(plan.files) and [f.bytes for run in plan.files for f in run] == sizes
        best = min(max(sum(sizes[a:b]) for a, b in zip((0,) + cut, cut + (len(sizes),)))
                   for cut in itertools.combinations(range(1, len(sizes)), n - 1))
        assert max(plan.shard_bytes(k) for k in range(n)) == best, (sizes, n)

    stdout = _finish(_launch(parts, tokenizer_dir, tmp_path / "never", DRY_RUN="1"))
    sizes = {p.name: p.stat().st_size for p in parts.glob("*.jsonl")}
    lines = stdout.strip().splitlines()
    assert lines[0].startswith(f"plan: 6 files, {sum(sizes.values()):,} bytes in 4 shards")
    assert len(lines) == 5 and all(f"shard {k:5d}:" in lines[k + 1] for k in range(4))
    assert not (tmp_path / "never").exists()
    # in an array, SHARDS defaults to the array's task count
    env = {key: value for key, value in os.environ.items() if key != "SHARDS"}
    proc = subprocess.run(["bash", str(REPO / "launch" / "preprocess.sh")], capture_output=True,
                          text=True, cwd=REPO, env={**env, "DRY_RUN": "1", "INPUT": str(parts / "*.jsonl"),
                                                    "SLURM_ARRAY_TASK_COUNT": "3", "PYTHON": sys.executable,
                                                    "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0 and " in 3 shards" in proc.stdout, proc.stderr
    # outside an array and without LOCAL=1 nothing runs
    proc = _launch(parts, tokenizer_dir, tmp_path / "never")
    assert proc.wait(timeout=60) == 2 and "not a SLURM array task" in proc.stderr.read()
    proc.stdout.close(), proc.stderr.close()


def test_shards_merge_to_the_single_process_bytes_and_blend_tokens(runs, parts, tmp_path, capsys):
    from megatron_biglm.data.blend import parse_blend
    from megatron_biglm.data.indexed_tools import check_dataset

    root, single, stdout = runs
    shards = root / "shards"
    manifests = [json.loads(p.read_text()) for p in sorted(shards.glob("shard_*.manifest.json"))]
    assert [m["shard"] for m in manifests] == [0, 1, 2, 3] and "4 shard(s) made" in stdout
    inputs = [f["path"] for m in manifests for f in m["inputs"]]
    assert inputs == sorted(str(p) for p in parts.glob("*.jsonl"))
    for m in manifests:
        for f in m["inputs"]:
            st = os.stat(f["path"])
            assert (f["bytes"], f["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
        out = m["outputs"]["text"]
        for suffix in ("bin", "idx"):
            path = shards / f"{out['prefix']}.{suffix}"
            assert out[suffix] == {"bytes": path.stat().st_size, "sha256": _sha256(path)}
    assert sum(m["documents"] for m in manifests) == single["documents"]
    assert sum(m["tokens"] for m in manifests) == single["tokens"]
    assert [m["skipped"] for m in manifests].count({"invalid_json": 1}) == 1
    assert sum(sum(m["skipped"].values()) for m in manifests) == sum(single["skipped"].values()) == 1

    merge = load_tool("merge_datasets")
    blend_file = tmp_path / "blend.json"
    assert merge.main(["--shards", str(shards), "--output-prefix", str(tmp_path / "merged"),
                       "--blend", str(blend_file)]) == 0
    capsys.readouterr()
    for suffix in ("bin", "idx"):
        assert (tmp_path / f"merged_text_document.{suffix}").read_bytes() == \
            (root / f"single_text_document.{suffix}").read_bytes()
    prefixes, weights = parse_blend(json.loads(blend_file.read_text()))
    assert len(prefixes) == 4
    assert sum(check_dataset(p).num_tokens for p in prefixes) == sum(weights) == single["tokens"]


def test_merge_refuses_a_missing_or_corrupt_shard_by_name(runs, tmp_path, capsys):
    root, _, _ = runs
    shards = tmp_path / "shards"
    shutil.copytree(root / "shards", shards)
    merge = load_tool("merge_datasets")

    def refused() -> str:
        assert merge.main(["--shards", str(shards), "--output-prefix", str(tmp_path / "m")]) == 1
        assert not (tmp_path / "m_text_document.idx").exists()
        return capsys.readouterr().err

    data = shards / "shard_00001_text_document.bin"
    original = data.read_bytes()
    data.write_bytes(original[:-2])
    error = refused()
    assert "shard_00001 is corrupt" in error and "shard_00001_text_document.bin has" in error
    data.write_bytes(original[:-2] + b"\xff\xff")  # same size, other bytes: the checksum
    assert "shard_00001_text_document.bin does not match its manifest's sha256" in refused()
    data.write_bytes(original)
    (shards / "shard_00002.manifest.json").unlink()
    assert "missing shard(s) shard_00002 of 4" in refused()
    (shards / "shard_00002.manifest.json").write_text("{not json")
    assert "shard_00002.manifest.json: unreadable shard manifest" in refused()


def test_rerun_redoes_only_killed_or_stale_shards(runs, parts, tokenizer_dir, tmp_path, capsys):
    from megatron_biglm.data.shards import (ShardSettings, plan_from_inputs, run_shard,
                                            shard_status)
    from megatron_biglm.data.tokenizer import load_tokenizer

    root, _, _ = runs
    shards = tmp_path / "shards"
    shutil.copytree(root / "shards", shards)
    (shards / "shard_00000.manifest.json").unlink()                      # killed before its manifest
    with open(shards / "shard_00001_text_document.bin", "r+b") as fh:   # truncated output
        fh.truncate(10)
    for name in ("shard_00002.manifest.json", "shard_00002_text_document.bin",
                 "shard_00002_text_document.idx"):                      # killed mid-write
        (shards / name).unlink()
    (shards / "shard_00002_text_document.bin.tmp-999999").write_bytes(b"partial")
    unchanged = (shards / "shard_00003.manifest.json").read_bytes()

    # what `LOCAL=1 SHARDS=4 bash launch/preprocess.sh` runs, in this process (one megatron import)
    from megatron_biglm.cli.preprocess_shards import main as shards_main

    capsys.readouterr()
    assert shards_main(["--input", str(parts / "*.jsonl"), "--shards", "4", "--tokenizer",
                        str(tokenizer_dir), "--out", str(shards), "--task", "all"]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]
    assert [r["status"] for r in results] == ["done", "done", "done", "up to date"]
    assert "shard_00001_text_document.bin has 10 bytes" in results[1]["reason"]
    assert (shards / "shard_00003.manifest.json").read_bytes() == unchanged
    assert not list(shards.glob("*.tmp-*"))
    merge = load_tool("merge_datasets")
    assert merge.main(["--shards", str(shards), "--output-prefix", str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged_text_document.bin").read_bytes() == \
        (root / "single_text_document.bin").read_bytes()
    capsys.readouterr()

    # touching an input makes its shard (and only that one) stale; running it again re-makes it
    last = sorted(parts.glob("*.jsonl"))[-1]
    st = last.stat()
    tokenizer = load_tokenizer(tokenizer_dir)
    settings = ShardSettings(str(tokenizer_dir)).fingerprint(tokenizer)
    try:
        os.utime(last, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        plan = plan_from_inputs([str(parts / "*.jsonl")], 4)
        assert [bool(shard_status(shards, plan, k, settings)) for k in range(4)] == [False] * 3 + [True]
        assert "inputs changed" in shard_status(shards, plan, 3, settings)
        result = run_shard(plan, 3, shards, ShardSettings(str(tokenizer_dir)), tokenizer)
        assert result["status"] == "done" and not shard_status(shards, plan, 3, settings)
    finally:
        os.utime(last, ns=(st.st_atime_ns, st.st_mtime_ns))
    # another tokenizer option makes every shard stale
    other = ShardSettings(str(tokenizer_dir), append_eod=False).fingerprint(tokenizer)
    assert all("append_eod" in shard_status(shards, plan, k, other) for k in range(4))


def test_merge_refuses_a_shard_whose_input_changed_since_unless_allowed(runs, parts, tmp_path, capsys):
    """An input edited after the array ran (without re-running it): the merge names the stale
    shard and its file and writes nothing; --allow-stale merges the shards as they are and
    lists the stale one."""
    root, _, _ = runs
    merge = load_tool("merge_datasets")
    edited = sorted(parts.glob("*.jsonl"))[-1]
    original, st = edited.read_bytes(), edited.stat()
    try:
        edited.write_bytes(original + b'{"text": "a scene added after the array ran"}\n')
        capsys.readouterr()
        assert merge.main(["--shards", str(root / "shards"), "--output-prefix", str(tmp_path / "m")]) == 1
        error = capsys.readouterr().err
        assert re.search(r"1 stale shard\(s\).*shard_00003: \S+part_5\.jsonl changed since it was preprocessed "
                         r"\([\d,]+ bytes then, [\d,]+ now.*--allow-stale", error), error
        assert not list(tmp_path.glob("m*"))
        assert merge.main(["--shards", str(root / "shards"), "--output-prefix", str(tmp_path / "m"),
                           "--allow-stale"]) == 0
        assert "--allow-stale: merged the stale shard_00003: " in capsys.readouterr().err
        assert (tmp_path / "m_text_document.bin").read_bytes() == (root / "single_text_document.bin").read_bytes()
    finally:
        edited.write_bytes(original)
        os.utime(edited, ns=(st.st_atime_ns, st.st_mtime_ns))
