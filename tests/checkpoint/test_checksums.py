"""The CRC-32 checker of stored items (checkpoint/checksums.py) against real zip archives laid
out as DCP lays them (one archive per item inside a shared file, a raw item among them):
`torch.save` archives, and zipfile-written ones with zip64 records, data descriptors or
deflated entries. A flipped byte in any entry's data names its item; an untouched file passes;
on a flipped byte anywhere in an item (headers included) the verdict agrees with
`zipfile.ZipFile.testzip`, the stricter exception being a directory whose sizes of an
uncompressed entry disagree (the checker refuses it; testzip reads the shorter one)."""
from __future__ import annotations

import io
import random
import zipfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from megatron_biglm.checkpoint.checksums import ChecksumReport, CorruptItem, check_items

_KINDS = ("torch", "zip64", "descriptor", "deflated")


class _Unseekable(io.RawIOBase):
    """A write-only stream without seek: zipfile then writes data descriptors after entries."""

    def __init__(self):
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, b):
        self.data += b
        return len(b)


def _archive(kind: str, payloads: list[bytes]) -> bytes:
    """A zip archive of `kind` holding `payloads` as entries."""
    if kind == "torch":
        buffer = io.BytesIO()
        torch.save([torch.frombuffer(bytearray(p), dtype=torch.uint8) for p in payloads], buffer)
        return buffer.getvalue()
    sink = _Unseekable() if kind == "descriptor" else io.BytesIO()
    method = zipfile.ZIP_DEFLATED if kind == "deflated" else zipfile.ZIP_STORED
    with zipfile.ZipFile(sink, "w", compression=method) as archive:
        for index, payload in enumerate(payloads):
            with archive.open(zipfile.ZipInfo(f"entry/{index}"), "w", force_zip64=kind == "zip64") as entry:
                entry.write(payload)
    return bytes(sink.data) if kind == "descriptor" else sink.getvalue()


#: entry bytes: random, so that each occurs once in its archive (a test can find it)
_payloads = st.tuples(st.integers(0, 2 ** 32), st.integers(16, 300)).map(lambda t: random.Random(t[0]).randbytes(t[1]))


@st.composite
def _files(draw, kinds=_KINDS):
    """A file of items (some zip archives of random `kinds`, one raw item), with gaps between
    them: (its bytes, items as (offset, length, name), {item name: its payloads})."""
    blob, items, payloads = bytearray(), [], {}
    for index in range(draw(st.integers(1, 4))):
        blob += draw(st.binary(max_size=40))
        kind = draw(st.sampled_from(kinds))
        entries = draw(st.lists(_payloads, min_size=1, max_size=3))
        data = _archive(kind, entries)
        name = f"item{index}.{kind}"
        items.append((len(blob), len(data), name))
        payloads[name] = entries
        blob += data
    raw = draw(st.binary(min_size=8, max_size=64).filter(lambda b: not b.startswith(b"PK\x03\x04")))
    items.append((len(blob), len(raw), "raw item"))
    blob += raw
    return bytes(blob), items, payloads


def _check(tmp_path, blob: bytes, items) -> ChecksumReport:
    (tmp_path / "__0_0.distcp").write_bytes(blob)
    report = ChecksumReport()
    check_items(tmp_path, [("__0_0.distcp", offset, length, name) for offset, length, name in items], report)
    return report


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
@given(_files())
def test_an_untouched_file_passes_with_every_item_counted(tmp_path, drawn):
    blob, items, _ = drawn
    report = _check(tmp_path, blob, items)
    assert (report.checked, report.unchecked) == (len(items) - 1, 1)
    assert report.bytes == sum(length for _, length, name in items if name != "raw item")


@_SETTINGS
@given(_files(kinds=_KINDS[:3]), st.data())
def test_a_flipped_byte_in_entry_data_names_its_item(tmp_path, drawn, data):
    """(A deflated entry's bytes are a compressed stream, where a flip may hit ignored padding
    bits: the comparison with testzip below covers those.)"""
    blob, items, payloads = drawn
    offset, length, name = data.draw(st.sampled_from([i for i in items if i[2] != "raw item"]))
    payload = data.draw(st.sampled_from(payloads[name]))
    start = blob.index(payload, offset)
    assert start + len(payload) <= offset + length
    damaged = bytearray(blob)
    damaged[start + data.draw(st.integers(0, len(payload) - 1))] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptItem) as exc:
        _check(tmp_path, bytes(damaged), items)
    assert exc.value.item == name and exc.value.path == tmp_path / "__0_0.distcp"


def _testzip_refuses(archive: bytes) -> bool:
    try:
        return zipfile.ZipFile(io.BytesIO(archive)).testzip() is not None
    except Exception:  # any failure to read it through is a refusal
        return True


def _stored_sizes_disagree(archive: bytes) -> bool:
    try:
        infos = zipfile.ZipFile(io.BytesIO(archive)).infolist()
    except Exception:
        return False
    return any(i.compress_type == zipfile.ZIP_STORED and i.file_size != i.compress_size for i in infos)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_files(), st.data())
def test_verdicts_on_a_flipped_byte_anywhere_agree_with_testzip(tmp_path, drawn, data):
    blob, items, _ = drawn
    offset, length, name = data.draw(st.sampled_from([i for i in items if i[2] != "raw item"]))
    position = offset + data.draw(st.integers(0, length - 1))
    damaged = bytearray(blob)
    damaged[position] ^= data.draw(st.integers(1, 255))
    try:
        _check(tmp_path, bytes(damaged), [(offset, length, name)])
        refused = False
    except CorruptItem as exc:
        assert exc.item == name
        refused = True
    archive = bytes(damaged[offset:offset + length])
    expected = _testzip_refuses(archive)
    if position < offset + 4:  # no longer starts as a zip archive: counted unchecked
        return
    assert refused == expected or (refused and _stored_sizes_disagree(archive)), (name, position - offset)


def test_an_entry_recorded_past_its_item_is_corrupt_not_a_crash(tmp_path):
    archive = bytearray(_archive("torch", [b"x" * 64]))
    record = archive.index(b"PK\x01\x02")  # the directory's first entry: make its sizes run past the item
    archive[record + 20:record + 28] = (10 ** 6).to_bytes(4, "little") * 2
    entry = archive[record + 46:record + 46 + int.from_bytes(archive[record + 28:record + 30], "little")].decode()
    with pytest.raises(CorruptItem) as exc:
        _check(tmp_path, bytes(archive), [(0, len(archive), "the item")])
    assert exc.value.item == "the item" and exc.value.why == f"zip entry {entry}"


def test_a_file_ending_inside_an_item_is_reported(tmp_path):
    archive = _archive("torch", [b"y" * 100])
    (tmp_path / "__0_0.distcp").write_bytes(archive[:-10])
    with pytest.raises(CorruptItem) as exc:
        check_items(tmp_path, [("__0_0.distcp", 0, len(archive), "the item")], ChecksumReport())
    assert exc.value.item == "the item" and "unreadable archive" in exc.value.why
