"""The one checkpoint verifier, run before any load: resume (both backends), the weights-only
start (fine-tuning, HF imports), evaluation and export.

Why every path: a flipped byte inside a tensor keeps the file size, so the manifest's sizes
(dirs.verify) pass and `torch.load` reads the wrong numbers without complaint; a resumed run
would then save new checkpoints from corrupted weights. Every item PyTorch stores is a zip
archive (`torch.save`) carrying a CRC-32 per entry, so this checks them all, optimizer state
included (checksums.py does the reading): each DCP item of `dist/` (located through its
`.metadata`), and every other zip-format file (`common.pt`, `rng/*.pt`, DeepSpeed's module
and ZeRO shard files under `deepspeed/`). Small plain files (JSON, YAML) are checked by the
manifest's sizes and by parsing.

A corrupt checkpoint is refused with the file, the item and where to go instead: the
previous complete checkpoint beside it. `checkpoint.verify=false` (train), `verify=false`
(the `biglm` eval model) and `--no-verify` (`python -m megatron_biglm.cli.convert to-hf`) skip the CRC pass
for storage one trusts; the manifest is always checked.

Under torch.distributed (training), `collective=True` splits the items over the ranks and
shares any failure, so every rank refuses together and none re-reads the whole checkpoint.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from .checksums import ChecksumReport, CorruptItem, check_items, dist_items
from .dirs import LOAD_KEY, CheckpointError, previous_checkpoint
from .dirs import verify as verify_manifest
from .dist_reader import DistCheckpointReadError

_ZIP_MAGIC = b"PK\x03\x04"


class CorruptCheckpointError(CheckpointError):
    """A stored item failed its CRC-32 check; `.file` and `.item` name it."""

    def __init__(self, message: str, file: str, item: str):
        super().__init__(message)
        self.file, self.item = file, item


@dataclass
class VerifyReport:
    path: Path
    items: int          # stored items whose CRC-32s matched
    unchecked: int      # stored items that are not zip archives
    bytes: int
    seconds: float

    def note(self) -> str:
        return (f"verified {self.path}: {self.items} stored items passed their CRC-32 check "
                f"({self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s)"
                + (f"; {self.unchecked} are not zip archives and were not checked" if self.unchecked else ""))


def _advice(folder: Path, key: str) -> str:
    """Where to go instead, said with `key`: the config key that named the checkpoint."""
    prev = previous_checkpoint(folder)
    if prev is not None:
        verb = "resume from" if key == LOAD_KEY else "start from"
        return (f"{verb} the previous checkpoint: `{key}={prev}` (evaluate or export "
                f"that one instead), or re-copy this one if it came from elsewhere")
    return ("no earlier complete checkpoint exists beside it: re-copy the checkpoint if it came from "
            "elsewhere, or " + ("start fresh with `checkpoint.load=none`" if key == LOAD_KEY else
                                f"point {key} at another checkpoint"))


def _all_items(folder: Path) -> list:
    """(relative file, offset, length, item name) of everything to CRC-check, in a fixed order."""
    items = []
    dist = folder / "dist"
    if (dist / ".metadata").is_file():
        items += [(f"dist/{rel}", off, length, name) for rel, off, length, name in dist_items(dist)]
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and not rel.endswith(".distcp"):
            with open(path, "rb") as handle:
                if handle.read(4) == _ZIP_MAGIC:
                    items.append((rel, 0, path.stat().st_size, f"the torch.save archive {rel}"))
    return items


def verify_checkpoint(folder, *, collective: bool = False, key: str = LOAD_KEY) -> VerifyReport:
    """Check `folder` (an `iter_N` checkpoint): manifest sizes, then the CRC-32 of every stored
    item; CheckpointError (CorruptCheckpointError for a bad item) naming the file, the item and
    the previous checkpoint to use. `collective`: every rank of the process group calls it and
    checks its share. `key`: the config key that named the checkpoint (the advice names it)."""
    folder = Path(folder)
    start = time.perf_counter()
    verify_manifest(folder, key)
    rank, world = _rank_world(collective)
    report, failure = ChecksumReport(), None
    try:
        items = _all_items(folder)
        check_items(folder, items[rank::world], report)
    except CorruptItem as exc:
        failure = ("corrupt", str(exc.path), exc.item, exc.why)
    except (FileNotFoundError, DistCheckpointReadError) as exc:
        failure = ("unreadable", str(getattr(exc, "filename", None) or folder), "", str(exc))
    if collective and world > 1:
        failure, report = _share(failure, report)
    if failure is not None:
        kind, file, item, why = failure
        if kind == "corrupt":
            raise CorruptCheckpointError(
                f"checkpoint {folder} is corrupt: in {file}, the stored bytes of {item} fail their CRC-32 "
                f"check ({why}). Do not load it; {_advice(folder, key)}", file, item)
        raise CheckpointError(f"checkpoint {folder} cannot be read ({why}); {_advice(folder, key)}")
    return VerifyReport(folder, report.checked, report.unchecked, report.bytes, time.perf_counter() - start)


def _rank_world(collective: bool) -> tuple[int, int]:
    if not collective:
        return 0, 1

    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _share(failure, report: ChecksumReport):
    """Every rank's first failure and item counts, gathered: the lowest rank's failure wins."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (failure, report.checked, report.unchecked, report.bytes))
    total = ChecksumReport(sum(g[1] for g in gathered), sum(g[2] for g in gathered), sum(g[3] for g in gathered))
    return next((g[0] for g in gathered if g[0] is not None), None), total
