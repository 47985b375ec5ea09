"""Detect silently corrupted bytes in a torch_dist checkpoint before exporting it.

Why: the trainer's manifest catches missing and truncated files (sizes), but a flipped byte
inside a tensor keeps the size and `torch.load` does not check it: the export would ship wrong
weights that still load. PyTorch DCP writes every item as its own `torch.save` zip archive
inside a ``.distcp`` file, and zip stores a CRC-32 per entry, so every model item can be
checked against the checksum written at save time.

How, cheaply: each file is memory-mapped once. `zipfile` reads only an item's central
directory (entry names, offsets, sizes, CRCs); `torch.save` stores its entries uncompressed, so
each entry's CRC-32 is computed straight over its bytes in the mapping, never copied. The
checks are the ones `zipfile.ZipFile.testzip` makes (the local header's signature and name,
the CRC over the stored bytes) plus the bounds: an entry whose bytes run past its item, into the
next entry or into the central directory is corrupt. Any entry stored otherwise (compressed,
or flagged as encrypted) is read through `zipfile` itself.
"""
from __future__ import annotations

import contextlib
import io
import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.checkpoint import FileSystemReader

from .dist_reader import DistCheckpointReadError

_ZIP_MAGIC = b"PK\x03\x04"
#: the fixed part of a zip local file header: signature, versions, flags, method, time, date,
#: CRC, sizes, then the lengths of the name and the extra field that follow it
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")
#: flag bits under which the stored bytes are not the entry's plain bytes
_ENCRYPTED_OR_PATCHED = 0x1 | 0x20 | 0x40
_UTF8_NAME = 0x800
#: what reading a damaged archive through `zipfile` raises, besides BadZipFile
_READ_ERRORS = (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError,
                zlib.error, struct.error)


class _Window(io.RawIOBase):
    """A read-only, seekable file over bytes [offset, offset + length) of a buffer (the mapped
    file): what `zipfile` reads an item's central directory through."""

    def __init__(self, view: memoryview, offset: int, length: int):
        self._view, self._offset, self._length, self._pos = view, offset, length, 0

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
        start = self._offset + self._pos
        buffer[:want] = self._view[start:start + want]
        self._pos += want
        return want


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


def check_archive(view: memoryview, offset: int, length: int, path: Path, item: str,
                  report: ChecksumReport) -> None:
    """CRC-check the zip archive (a `torch.save` payload) at [offset, offset+length) of `view`
    (the whole file's bytes); raise CorruptItem naming `item` when an entry fails or the
    archive cannot be read. Non-zip bytes are counted unchecked."""
    if offset + length > len(view):
        raise CorruptItem(path, item, f"unreadable archive (the file ends at byte {len(view)}, "
                                      f"inside the item's bytes {offset}..{offset + length})")
    if view[offset:offset + 4] != _ZIP_MAGIC:
        report.unchecked += 1
        return
    try:
        bad_entry = _first_bad_entry(view, offset, length)
    except _READ_ERRORS as exc:
        raise CorruptItem(path, item, f"unreadable archive ({exc})") from None
    if bad_entry is not None:
        raise CorruptItem(path, item, f"zip entry {bad_entry}")
    report.checked += 1
    report.bytes += length


def _first_bad_entry(view: memoryview, offset: int, length: int) -> str | None:
    """The name of the first entry of the archive at [offset, offset+length) whose stored bytes
    fail their check, or None; `_READ_ERRORS` when the archive's directory cannot be read."""
    with zipfile.ZipFile(_Window(view, offset, length)) as archive:
        entries = sorted(archive.infolist(), key=lambda info: info.header_offset)
        # an entry's bytes end before the next entry's header (the last: before the directory)
        ends = [info.header_offset for info in entries[1:]] + [archive.start_dir]
        for info, end in zip(entries, ends):
            if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & _ENCRYPTED_OR_PATCHED:
                if not _reads_clean(archive, info):
                    return info.filename
            elif not _stored_entry_intact(view, offset, info, min(end, length)):
                return info.filename
    return None


def _stored_entry_intact(view: memoryview, offset: int, info: zipfile.ZipInfo, end: int) -> bool:
    """Whether an uncompressed entry is intact: the directory records one size for it (stored
    bytes are the entry's bytes), its local header is one and names it, and its bytes, lying
    before `end` (relative to the archive at `offset`), match the directory's CRC-32."""
    start = info.header_offset
    if start < 0 or start + _LOCAL_HEADER.size > end or info.file_size != info.compress_size:
        return False
    header = _LOCAL_HEADER.unpack_from(view, offset + start)
    name_length, extra_length = header[-2], header[-1]
    data = start + _LOCAL_HEADER.size + name_length + extra_length
    if header[0] != _ZIP_MAGIC or data + info.compress_size > end:
        return False
    name = bytes(view[offset + start + _LOCAL_HEADER.size:offset + start + _LOCAL_HEADER.size + name_length])
    try:
        if name.decode("utf-8" if header[3] & _UTF8_NAME else "cp437") != info.orig_filename:
            return False
    except UnicodeDecodeError:
        return False
    return zlib.crc32(view[offset + data:offset + data + info.compress_size]) == info.CRC


def _reads_clean(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    """Whether `zipfile` reads a (compressed) entry to its end with a matching CRC-32."""
    try:
        with archive.open(info) as entry:
            while entry.read(1 << 20):
                pass
    except _READ_ERRORS:
        return False
    return True


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
    """CRC-check `(relative file, offset, length, name)` items of files under `folder`, in order,
    each file mapped once; CorruptItem on the first bad one, FileNotFoundError for a missing file."""
    with contextlib.ExitStack() as stack:
        views = {}
        for relative, offset, length, name in items:
            if relative not in views:
                views[relative] = stack.enter_context(_mapped(Path(folder) / relative))
            check_archive(views[relative], offset, length, Path(folder) / relative, name, report)


@contextlib.contextmanager
def _mapped(path: Path):
    """The bytes of the file at `path` as a memoryview over a read-only mapping (empty for an
    empty file), unmapped on exit."""
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(handle.fileno()).st_size else None
    view = memoryview(mapped if mapped is not None else b"")
    try:
        yield view
    finally:
        view.release()
        if mapped is not None:
            mapped.close()
