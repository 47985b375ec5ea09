"""What identifies a file's content: its size and SHA-256, read in chunks (no whole-file read,
and no `hashlib.file_digest`, which Python 3.10 lacks). Shard manifests, a fine-tune's run
identity and a tokenizer's digest all record files this one way."""
from __future__ import annotations

import hashlib
import os

_CHUNK = 1 << 20


def sha256_file(path) -> str:
    """The hex SHA-256 of the file at `path`."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_content(path) -> dict:
    """`{"bytes": size, "sha256": hex digest}` of the file at `path`."""
    return {"bytes": os.path.getsize(path), "sha256": sha256_file(path)}
