"""Preprocessing a corpus as N independent shards (a SLURM job array), resumable and checked.

A corpus too large for one node is cut into N shards, each a contiguous run of the sorted
input file list, balanced by bytes. Shard k is tokenized by array task k into
`OUT/shard_{k:05d}_{key}_document.{bin,idx}` (megatron naming, one dataset per json key)
and described by `OUT/shard_{k:05d}.manifest.json`. Because the shards hold whole files in
file order, concatenating them in shard order gives exactly the bytes one process would
write over the same sorted file list.

The manifest is what makes the array resumable and the merge safe. It records
  * the shard's place in the plan (`shard`, `shards`) and its inputs (path, bytes, mtime_ns);
  * the settings that shape the output (a digest of the tokenizer itself, json keys, EOD,
    text mode, input format) -- not the worker count or batch size, which never change bytes;
  * documents, tokens, skipped inputs by reason (with examples), and per output file its
    size and sha256.
It is written last, under a temporary name then renamed, after the outputs (themselves
written under temporary names, see `AtomicIndexedWriter`). So a shard killed at any point
has either no manifest or one whose checksums do not match: `shard_status` calls it stale
and the next run redoes it. A shard is up to date only when its manifest names exactly its
planned inputs with their current sizes and mtimes, the same settings, and outputs with
matching checksums; a re-submitted array redoes only the shards that are not.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from megatron_biglm.common.file_content import file_content, sha256_file
from megatron_biglm.data.indexed_tools import merge_datasets
from megatron_biglm.data.preprocess import DEFAULT_BATCH_SIZE, output_prefix_for, preprocess
from megatron_biglm.data.readers import SkipReport, expand_inputs
from megatron_biglm.data.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = "megatron_biglm.preprocess_shard/1"
MANIFEST_SUFFIX = ".manifest.json"


class ShardError(ValueError):
    """A shard plan that cannot be made, or a shard directory that cannot be merged; the
    message names the file or shard and says what to do."""


# ---------------------------------------------------------------- inputs and plan

@dataclass(frozen=True)
class InputFile:
    """One input file as planned: its path and the size/mtime that make a shard current."""
    path: str
    bytes: int
    mtime_ns: int

    def as_dict(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, "mtime_ns": self.mtime_ns}


@dataclass(frozen=True)
class ShardPlan:
    """Which files each of `shards` shards takes: `files[k]` is shard k's run of files."""
    files: tuple[tuple[InputFile, ...], ...]

    @property
    def shards(self) -> int:
        return len(self.files)

    def shard_bytes(self, k: int) -> int:
        return sum(f.bytes for f in self.files[k])

    def describe(self) -> list[str]:
        """The plan, one line per shard (what `DRY_RUN=1` prints)."""
        total = sum(self.shard_bytes(k) for k in range(self.shards))
        n_files = sum(len(files) for files in self.files)
        lines = [f"plan: {n_files} files, {total:,} bytes in {self.shards} shards "
                 f"(largest {max(self.shard_bytes(k) for k in range(self.shards)):,} bytes)"]
        for k, files in enumerate(self.files):
            lines.append(f"  shard {k:5d}: {len(files):4d} files {self.shard_bytes(k):>14,} bytes  "
                         f"{files[0].path} .. {files[-1].path}")
        return lines


def input_files(inputs: Sequence[str]) -> list[str]:
    """Paths, globs, directories and `@LIST` files (one path per line; blank lines and lines
    starting with '#' ignored; relative paths are relative to the list file's folder) ->
    the sorted, de-duplicated file list. A pattern matching nothing, or a listed file that
    does not exist, is an error naming it: a plan must not silently lose part of a corpus."""
    expanded: list[str] = []
    for item in inputs:
        item = str(item)
        if item.startswith("@"):
            expanded += _read_list(item[1:])
        else:
            expanded.append(item)
    report = SkipReport()
    files = expand_inputs(expanded, report)
    if report.total:
        raise ShardError(f"inputs matched no files: {'; '.join(report.example_lines())}; "
                         "check INPUT (quote globs)")
    missing = [str(path) for path in files if not os.path.isfile(path)]
    if missing:
        raise ShardError(f"input files do not exist: {missing[:5]}"
                         f"{f' and {len(missing) - 5} more' if len(missing) > 5 else ''}")
    return sorted({str(path) for path in files})


def _read_list(list_path: str) -> list[str]:
    try:
        lines = Path(list_path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ShardError(f"cannot read the input list {list_path}: {exc}") from exc
    folder = Path(list_path).parent
    paths = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not paths:
        raise ShardError(f"input list {list_path} names no files")
    return [str(path if os.path.isabs(path) else folder / path) for path in paths]


def stat_files(paths: Sequence[str]) -> list[InputFile]:
    result = []
    for path in paths:
        st = os.stat(path)
        result.append(InputFile(str(path), int(st.st_size), int(st.st_mtime_ns)))
    return result


def plan_shards(files: Sequence[InputFile], shards: int) -> ShardPlan:
    """Cut the (sorted) files into `shards` contiguous, non-empty runs whose largest byte
    total is as small as possible. Files are never split, so there must be at least as many
    files as shards."""
    if shards < 1:
        raise ShardError(f"SHARDS must be >= 1, got {shards}")
    if len(files) < shards:
        raise ShardError(f"{shards} shards but only {len(files)} input files: a shard is a "
                         f"run of whole files; use SHARDS <= {len(files)}")
    sizes = [f.bytes for f in files]
    low, high = max(sizes), sum(sizes)
    while low < high:  # the smallest cap that `_cut` can meet with `shards` runs
        cap = (low + high) // 2
        if len(_cut(sizes, cap, None)) + 1 <= shards:
            high = cap
        else:
            low = cap + 1
    bounds = _cut(sizes, low, shards)
    if len(bounds) + 1 != shards:  # cannot happen: the cap admits `shards` runs
        raise AssertionError(f"shard plan made {len(bounds) + 1} runs, not {shards}")
    edges = [0] + bounds + [len(files)]
    return ShardPlan(tuple(tuple(files[a:b]) for a, b in zip(edges, edges[1:])))


def _cut(sizes: Sequence[int], cap: int, shards: int | None) -> list[int]:
    """Start indices of runs 1.. when filling runs greedily up to `cap` bytes; with
    `shards`, a run also ends early when the files left are just enough for one per
    remaining run, so exactly `shards` non-empty runs come out."""
    bounds: list[int] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        after_current = None if shards is None else shards - len(bounds) - 1
        if i > start and (total + size > cap or (after_current is not None
                                                   and len(sizes) - i <= after_current)):
            bounds.append(i)
            start, total = i, 0
        total += size
    return bounds


# ---------------------------------------------------------------- settings and manifests

@dataclass(frozen=True)
class ShardSettings:
    """What shapes a shard's bytes besides its inputs."""
    tokenizer: str
    json_keys: tuple[str, ...] = ("text",)
    append_eod: bool = True
    text_mode: str = "block"
    input_format: str = "auto"

    def fingerprint(self, tokenizer) -> dict:
        """The settings as recorded in a manifest; the tokenizer by a digest of its rules
        and special ids, not its path: a changed tokenizer at the same path makes shards
        stale, the same tokenizer found under another path does not."""
        rules = tokenizer.backend_tokenizer.to_str()
        specials = f"{tokenizer.eos_token_id}|{bool(getattr(tokenizer, 'split_special_tokens', False))}"
        return {"tokenizer_sha256": hashlib.sha256((rules + "|" + specials).encode()).hexdigest(),
                "json_keys": list(self.json_keys), "append_eod": bool(self.append_eod),
                "text_mode": self.text_mode, "input_format": self.input_format}


def shard_name(k: int) -> str:
    return f"shard_{k:05d}"


def manifest_path(out_dir, k: int) -> Path:
    return Path(out_dir) / (shard_name(k) + MANIFEST_SUFFIX)




def read_manifest(path) -> dict | None:
    """The manifest at `path`, or None when it is missing or unreadable (not JSON, wrong
    format): either way the shard is not done."""
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT else None


def output_problems(out_dir, manifest: dict) -> list[str]:
    """What is wrong with the outputs a manifest describes (missing file, size, checksum);
    empty when they are intact."""
    problems = []
    for key, output in manifest.get("outputs", {}).items():
        for suffix in ("bin", "idx"):
            path = Path(out_dir) / f"{output['prefix']}.{suffix}"
            expected = output[suffix]
            if not path.is_file():
                problems.append(f"{path} is missing")
            elif os.path.getsize(path) != expected["bytes"]:
                problems.append(f"{path} has {os.path.getsize(path):,} bytes, its manifest "
                                f"says {expected['bytes']:,}")
            elif sha256_file(path) != expected["sha256"]:
                problems.append(f"{path} does not match its manifest's sha256")
    if not manifest.get("outputs"):
        problems.append("the manifest lists no outputs")
    return problems


def shard_status(out_dir, plan: ShardPlan, k: int, settings: dict) -> str:
    """'' when shard k is up to date, else why it must be (re)done."""
    path = manifest_path(out_dir, k)
    manifest = read_manifest(path)
    if manifest is None:
        return f"no valid manifest {path.name}" if not path.exists() else f"{path.name} is unreadable"
    if (manifest.get("shard"), manifest.get("shards")) != (k, plan.shards):
        return f"{path.name} is shard {manifest.get('shard')} of {manifest.get('shards')}, not {k} of {plan.shards}"
    if manifest.get("settings") != settings:
        changed = sorted(name for name in set(settings) | set(manifest.get("settings") or {})
                         if settings.get(name) != (manifest.get("settings") or {}).get(name))
        return f"settings changed: {', '.join(changed)}"
    planned = [f.as_dict() for f in plan.files[k]]
    if manifest.get("inputs") != planned:
        return "its inputs changed (files, sizes or mtimes)"
    problems = output_problems(out_dir, manifest)
    return "; ".join(problems)


def _remove_leftovers(out_dir: Path, k: int) -> int:
    """Delete shard k's manifest and any temporaries a killed run left; return how many."""
    removed = 0
    prefix = glob.escape(str(out_dir / shard_name(k)))
    leftovers = glob.glob(prefix + "_*.tmp-*") + glob.glob(prefix + ".*.tmp-*")
    for path in leftovers + [str(manifest_path(out_dir, k))]:
        if os.path.exists(path):
            os.remove(path)
            removed += 1
    return removed


def _write_json_atomically(path: Path, data) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- running shards

def run_shard(plan: ShardPlan, k: int, out_dir, settings: ShardSettings, tokenizer=None, *,
              workers: int = 1, batch_size: int | None = None, strict: bool = False,
              force: bool = False) -> dict:
    """Make shard k of `plan` in `out_dir` unless it is already up to date (or `force`).
    Returns {"shard", "status": "done"|"up to date", "reason", "manifest"}."""
    if not 0 <= k < plan.shards:
        raise ShardError(f"shard {k} is outside the plan's 0..{plan.shards - 1} (check SHARDS "
                         f"and the array range: --array=0-{plan.shards - 1})")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(tokenizer if tokenizer is not None else settings.tokenizer)
    fingerprint = settings.fingerprint(tokenizer)
    reason = "forced" if force else shard_status(out_dir, plan, k, fingerprint)
    if not reason:
        return {"shard": k, "status": "up to date", "reason": "",
                "manifest": read_manifest(manifest_path(out_dir, k))}
    removed = _remove_leftovers(out_dir, k)
    logger.info("shard %d of %d: making it (%s)%s", k, plan.shards, reason,
                f"; removed {removed} file(s) an earlier run left" if removed else "")
    summary = preprocess([f.path for f in plan.files[k]], str(out_dir / shard_name(k)), tokenizer,
                         json_keys=settings.json_keys, workers=workers,
                         append_eod=settings.append_eod, strict=strict,
                         batch_size=batch_size or DEFAULT_BATCH_SIZE,
                         text_mode=settings.text_mode, input_format=settings.input_format)
    stale_inputs = [f.path for f, now in zip(plan.files[k], stat_files([f.path for f in plan.files[k]]))
                    if now != f]
    if stale_inputs:
        raise ShardError(f"shard {k}: input files changed while being read: {stale_inputs}; "
                         "run the shard again once they are final")
    outputs = {}
    for key, out in summary["outputs"].items():
        prefix = os.path.basename(out["prefix"])
        outputs[key] = {"prefix": prefix, "documents": out["documents"], "tokens": out["tokens"],
                        "bin": file_content(out_dir / f"{prefix}.bin"),
                        "idx": file_content(out_dir / f"{prefix}.idx")}
    manifest = {
        "format": MANIFEST_FORMAT, "shard": k, "shards": plan.shards,
        "settings": fingerprint, "tokenizer": str(settings.tokenizer),
        "inputs": [f.as_dict() for f in plan.files[k]],
        "input_bytes": plan.shard_bytes(k),
        "documents": summary["documents"], "tokens": summary["tokens"],
        "skipped": summary["skipped"], "skipped_examples": summary["skipped_examples"],
        "unreadable_files": summary["unreadable_files"], "dtype": summary["dtype"],
        "outputs": outputs, "seconds": summary["seconds"],
        "tokens_per_s": summary["tokens_per_s"], "workers": workers,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_json_atomically(manifest_path(out_dir, k), manifest)
    return {"shard": k, "status": "done", "reason": reason, "manifest": manifest}


# ---------------------------------------------------------------- checking a shard directory

@dataclass(frozen=True)
class CheckedShards:
    """The manifests of a complete, intact shard directory, in shard order; `stale`: why each
    shard whose inputs changed since it was made is stale (kept only under `allow_stale`)."""
    out_dir: Path
    manifests: tuple[dict, ...]
    stale: tuple[str, ...] = ()

    def prefixes(self, key: str) -> list[str]:
        return [str(self.out_dir / m["outputs"][key]["prefix"]) for m in self.manifests]

    @property
    def keys(self) -> list[str]:
        return list(self.manifests[0]["settings"]["json_keys"])


def stale_inputs(manifest: dict) -> list[str]:
    """What changed in a shard's inputs since its manifest was written: a file gone, or
    another size or mtime. Empty when the shard is fresh."""
    out = []
    for planned in manifest.get("inputs", []):
        path = Path(planned["path"])
        if not path.is_file():
            out.append(f"{path} no longer exists")
            continue
        st = path.stat()
        if (int(st.st_size), int(st.st_mtime_ns)) != (planned["bytes"], planned["mtime_ns"]):
            out.append(f"{path} changed since it was preprocessed ({planned['bytes']:,} bytes then, "
                       f"{st.st_size:,} now; mtime {'same' if int(st.st_mtime_ns) == planned['mtime_ns'] else 'newer'})")
    return out


def check_shards(out_dir, *, allow_stale: bool = False) -> CheckedShards:
    """Every manifest in `out_dir` read and checked before anything is merged: the shards
    form one plan (same count, same settings, all of 0..N-1 present), their inputs follow
    one another in sorted order without overlap, every output matches its checksum, and
    every input still has the size and mtime it had when its shard was made (a stale shard
    is refused by name unless `allow_stale`, which keeps it and says so in `stale`).
    The first problem raises ShardError naming the shard and file."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        raise ShardError(f"{out_dir}: no such shard directory")
    paths = sorted(out_dir.glob("shard_*" + MANIFEST_SUFFIX))
    outputs = sorted(out_dir.glob("shard_*.idx"))
    if not paths:
        raise ShardError(f"{out_dir}: no shard manifests (shard_*{MANIFEST_SUFFIX}); "
                         "run launch/preprocess.sh first" + (
                             f" ({len(outputs)} .idx files without manifests: unfinished shards)"
                             if outputs else ""))
    manifests: dict[int, dict] = {}
    counts, settings = set(), []
    for path in paths:
        manifest = read_manifest(path)
        if manifest is None:
            raise ShardError(f"{path}: unreadable shard manifest (killed while writing, or not "
                             "a manifest); re-run launch/preprocess.sh to redo that shard")
        if path.name != manifest_path(out_dir, int(manifest["shard"])).name:
            raise ShardError(f"{path}: holds the manifest of shard {manifest['shard']}; "
                             "re-run launch/preprocess.sh to redo that shard")
        manifests[int(manifest["shard"])] = manifest
        counts.add(int(manifest["shards"]))
        settings.append(manifest["settings"])
    if len(counts) > 1:
        listing = ", ".join(f"{p.name}: of {read_manifest(p)['shards']}" for p in paths)
        raise ShardError(f"{out_dir}: manifests from plans with different shard counts ({listing}); "
                         "remove the shards of the old plan, or re-run with one SHARDS")
    n = counts.pop()
    missing = [shard_name(k) for k in range(n) if k not in manifests]
    if missing:
        raise ShardError(f"{out_dir}: missing shard(s) {', '.join(missing)} of {n} (no manifest: "
                         "never run, or killed); re-submit the array to redo them")
    if any(s != settings[0] for s in settings):
        raise ShardError(f"{out_dir}: shards made with different tokenizers/settings; "
                         "re-run launch/preprocess.sh with one configuration")
    previous = None
    for k in range(n):
        paths_k = [f["path"] for f in manifests[k]["inputs"]]
        if previous is not None and paths_k and not previous < paths_k[0]:
            raise ShardError(f"{manifest_path(out_dir, k)}: its inputs overlap or precede shard "
                             f"{k - 1}'s; the shards come from different plans: re-run the array")
        previous = paths_k[-1] if paths_k else previous
        problems = output_problems(out_dir, manifests[k])
        if problems:
            raise ShardError(f"{shard_name(k)} is corrupt: {'; '.join(problems)}; re-submit the "
                             "array (it redoes that shard)")
    stale = tuple(f"{shard_name(k)}: {'; '.join(why)}" for k in range(n)
                  for why in [stale_inputs(manifests[k])] if why)
    if stale and not allow_stale:
        raise ShardError(f"{out_dir}: {len(stale)} stale shard(s), made from inputs that have changed since: "
                         f"{' | '.join(stale)}. Re-submit the array (it redoes only the stale shards), or pass "
                         "--allow-stale to merge them as they are")
    return CheckedShards(out_dir, tuple(manifests[k] for k in range(n)), stale)


def merge_shards(out_dir, output_prefix, vocab_size: int | None = None, *, allow_stale: bool = False) -> dict:
    """Check the shard directory (`allow_stale`: see `check_shards`), then concatenate the
    shards of each json key, in shard order, into `{output_prefix}_{key}_document` (the name
    `preprocess` gives one process's output). Returns {key: merge summary, with the stale
    shards kept under "stale_shards"}."""
    checked = check_shards(out_dir, allow_stale=allow_stale)
    return {key: {**merge_datasets(checked.prefixes(key), output_prefix_for(output_prefix, key), vocab_size),
                  "stale_shards": list(checked.stale)} for key in checked.keys}


def write_blend(out_dir, blend_path, key: str | None = None, *, allow_stale: bool = False) -> dict:
    """Check the shard directory, then write `blend_path` (JSON) listing the shards of one
    json key as `[[tokens, prefix], ...]`: what `data.blend` takes, weighted by token count
    so sampling matches the merged corpus (`allow_stale`: see `check_shards`). Returns
    {"blend", "shards", "tokens", "stale_shards"}."""
    checked = check_shards(out_dir, allow_stale=allow_stale)
    key = key or checked.keys[0]
    if key not in checked.keys:
        raise ShardError(f"{out_dir}: no shards for json key {key!r} (keys: {checked.keys})")
    entries = []
    for manifest, prefix in zip(checked.manifests, checked.prefixes(key)):
        tokens = manifest["outputs"][key]["tokens"]
        if tokens:  # a blend weight must be > 0
            entries.append([tokens, os.path.abspath(prefix)])
    skipped = len(checked.manifests) - len(entries)
    if skipped:
        logger.warning("%d shard(s) hold no %r tokens and are left out of the blend", skipped, key)
    Path(blend_path).parent.mkdir(parents=True, exist_ok=True)
    _write_json_atomically(Path(blend_path), entries)
    return {"blend": str(blend_path), "shards": len(entries), "empty_shards_left_out": skipped,
            "tokens": sum(tokens for tokens, _ in entries), "stale_shards": list(checked.stale)}


def plan_from_inputs(inputs: Sequence[str], shards: int) -> ShardPlan:
    """`plan_shards` over the expanded, stat'ed inputs (see `input_files`)."""
    return plan_shards(stat_files(input_files(inputs)), shards)

