"""A reproducible sample of a corpus's documents, by count or byte budget (tokenizer training).

A tokenizer needs a representative sample, not the whole corpus: training BPE on terabytes
is slow and needs the text in memory. The sample is drawn across all files in one streaming
pass, so no file is favoured for coming first:
  * every document gets a priority, a hash of (seed, file name, line, json key): the same
    document keeps its priority wherever the corpus lives and whatever else it holds;
  * the sample is the longest run of documents in priority order that fits the limits
    (`max_documents`, `max_bytes` of UTF-8 text, or both), kept with a heap of the chosen
    ones; a document past a priority already dropped can never fit and is not kept.
Same seed, same files: the same sample; another seed: another. Memory is the sample's size.
The texts come back in corpus order (file, line).
"""
from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from megatron_biglm.data.readers import SkipReport, iter_records


def priority(seed: int, source, line: int, key: str) -> int:
    """The document's draw order (smaller is drawn first): 64 bits of a keyed hash."""
    digest = hashlib.blake2b(f"{Path(str(source)).name}\0{line}\0{key}".encode("utf-8"),
                             digest_size=8, key=str(int(seed)).encode())
    return int.from_bytes(digest.digest(), "little")


@dataclass
class TextSample:
    """The drawn texts (corpus order) and what was drawn out of what."""
    texts: list[str]
    seed: int
    max_documents: int | None
    max_bytes: int | None
    documents_seen: int = 0
    bytes_seen: int = 0
    bytes: int = 0
    files_seen: int = 0
    files_sampled: int = 0
    per_file: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"seed": self.seed, "max_documents": self.max_documents, "max_bytes": self.max_bytes,
                "documents": len(self.texts), "bytes": self.bytes,
                "documents_seen": self.documents_seen, "bytes_seen": self.bytes_seen,
                "files_sampled": self.files_sampled, "files_seen": self.files_seen}

    def summary_line(self) -> str:
        share = self.bytes / self.bytes_seen if self.bytes_seen else 0.0
        limits = ", ".join(part for part in (
            f"at most {self.max_documents:,} documents" if self.max_documents else "",
            f"at most {self.max_bytes:,} bytes" if self.max_bytes else "") if part)
        return (f"sampled {len(self.texts):,} of {self.documents_seen:,} documents, "
                f"{self.bytes:,} of {self.bytes_seen:,} bytes ({share:.1%}) from "
                f"{self.files_sampled} of {self.files_seen} files (seed {self.seed}; {limits})")


def sample_texts(inputs: Sequence, *, max_documents: int | None = None, max_bytes: int | None = None,
                 seed: int = 0, json_keys: Sequence[str] = ("text",), report: SkipReport,
                 text_mode: str = "block", input_format_name: str = "auto") -> TextSample:
    """Draw the sample (see the module docstring) from `inputs` (paths, globs, directories).
    Each json key's text is one document. Bad input is counted in `report`. Raises
    ValueError when no limit is given, a limit is below 1, or nothing fits the limits."""
    if max_documents is None and max_bytes is None:
        raise ValueError("give a sample size: a document count and/or a byte budget")
    json_keys = tuple(json_keys)
    for name, value in (("document count", max_documents), ("byte budget", max_bytes)):
        if value is not None and value < 1:
            raise ValueError(f"the sample's {name} must be >= 1, got {value}")
    chosen: list[tuple[int, int, int, str, str]] = []   # max-heap: (-priority, file, line, key, text)
    cutoff = None        # smallest priority dropped: nothing at or past it can be in the sample
    total_bytes = 0
    sample = TextSample([], int(seed), max_documents, max_bytes)
    file_order: dict[str, int] = {}
    for record in iter_records(inputs, json_keys=json_keys, report=report, text_mode=text_mode,
                               input_format_name=input_format_name):
        file_index = file_order.setdefault(record.source, len(file_order))
        for key, text in record.texts.items():
            size = len(text.encode("utf-8"))
            sample.documents_seen += 1
            sample.bytes_seen += size
            rank = priority(seed, record.source, record.line, key)
            if cutoff is not None and rank >= cutoff:
                continue
            heapq.heappush(chosen, (-rank, file_index, record.line, key, text))
            total_bytes += size
            while chosen and ((max_documents and len(chosen) > max_documents)
                              or (max_bytes and total_bytes > max_bytes)):
                dropped = heapq.heappop(chosen)
                total_bytes -= len(dropped[4].encode("utf-8"))
                cutoff = -dropped[0] if cutoff is None else min(cutoff, -dropped[0])
    sample.files_seen = report.files_seen
    if not chosen:
        if not sample.documents_seen:
            raise ValueError(f"no training text in {list(map(str, inputs))}: {report.summary_line()}")
        raise ValueError(f"no document fits the sample: the first drawn is larger than the byte "
                         f"budget {max_bytes:,}; raise the budget")
    ordered = sorted(chosen, key=lambda item: (item[1], item[2], json_keys.index(item[3])))
    sources = {index: source for source, index in file_order.items()}
    sample.texts = [item[4] for item in ordered]
    sample.bytes = total_bytes
    for item in ordered:
        name = sources[item[1]]
        sample.per_file[name] = sample.per_file.get(name, 0) + 1
    sample.files_sampled = len(sample.per_file)
    return sample
