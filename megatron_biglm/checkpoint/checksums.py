"""Detect silently corrupted bytes in a torch_dist checkpoint before exporting it.

Why: the trainer's manifest catches missing and truncated files (sizes), but a flipped byte
inside a tensor keeps the size and `torch.load` does not check it: the export would ship wrong
weights that still load. PyTorch DCP writes every item as its own `torch.save` zip archive
inside a ``.distcp`` file, and zip stores a CRC-32 per entry, so every model item can be
checked against the checksum written at save time. One item (read through a window on the
file, never into memory whole) is checked at a time.
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.checkpoint import FileSystemReader

from .dist_reader import DistCheckpointReadError

_ZIP_MAGIC = b"PK\x03\x04"


class _Window(io.RawIOBase):
    """A read-only, seekable view of bytes [offset, offset + length) of an open file."""

    def __init__(self, handle, offset: int, length: int):
        self._handle, self._offset, self._length, self._pos = handle, offset, length, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, pos, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = min(max(0, base + pos), self._length)
        return self._pos

    def readinto(self, buffer):
        want = min(len(buffer), self._length - self._pos)
        if want <= 0:
            return 0
        self._handle.seek(self._offset + self._pos)
        data = self._handle.read(want)
        buffer[:len(data)] = data
        self._pos += len(data)
        return len(data)


@dataclass
class ChecksumReport:
    checked: int = 0      # stored items whose zip CRC-32s matched
    unchecked: int = 0    # stored items not stored as zip archives (nothing to check against)
    bytes: int = 0        # bytes read


class CorruptItem(Exception):
    """One stored item failed its CRC-32 check: `path` (the file), `item` (what it holds), `why`."""

    def __init__(self, path: Path, item: str, why: str):
        super().__init__(f"{path}: {item}: {why}")
        self.path, self.item, self.why = Path(path), item, why


def check_archive(handle, offset: int, length: int, path: Path, item: str, report: ChecksumReport) -> None:
    """CRC-check the zip archive (a `torch.save` payload) at [offset, offset+length) of an open
    file; raise CorruptItem naming `item` when an entry fails. Non-zip bytes are counted unchecked."""
    window = _Window(handle, offset, length)
    if window.read(4) != _ZIP_MAGIC:
        report.unchecked += 1
        return
    window.seek(0)
    try:
        bad_entry = zipfile.ZipFile(io.BufferedReader(window, 1 << 20)).testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        bad_entry = f"unreadable archive ({exc})"
    if bad_entry is not None:
        raise CorruptItem(path, item, f"zip entry {bad_entry}" if "(" not in bad_entry else bad_entry)
    report.checked += 1
    report.bytes += length


def dist_items(dist_dir, prefixes: tuple = ()) -> list:
    """(file, offset, length, name) of every item DCP stored in `dist_dir` (its `.metadata`),
    in file order; `prefixes` keeps only the items whose name starts with one of them."""
    dist_dir = Path(dist_dir)
    try:
        storage = FileSystemReader(str(dist_dir)).read_metadata().storage_data
    except Exception as exc:
        raise DistCheckpointReadError(f"cannot read {dist_dir / '.metadata'}: {exc}") from exc
    return sorted((info.relative_path, info.offset, info.length, index.fqn)
                  for index, info in storage.items() if not prefixes or index.fqn.startswith(prefixes))


def check_items(folder: Path, items, report: ChecksumReport) -> None:
    """CRC-check `(relative file, offset, length, name)` items of files under `folder`, one
    open handle per file; CorruptItem on the first bad one, FileNotFoundError for a missing file."""
    handles = {}
    try:
        for relative, offset, length, name in items:
            if relative not in handles:
                handles[relative] = open(Path(folder) / relative, "rb")
            check_archive(handles[relative], offset, length, Path(folder) / relative, name, report)
    finally:
        for handle in handles.values():
            handle.close()


