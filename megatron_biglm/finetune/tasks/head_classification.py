"""Features for classification with a head on pooled encoder states (seed 001's baseline).

Layout: `[BOS] text_1 [EOS] text_2 [EOS] ...` (one segment per field, each closed by EOS), no
mask tokens and no target suffix, so `split` is 0 (every position sees every other one).
`length` is the valid length the pooling (mean over valid positions, or the first token)
must respect. When the texts do not fit, the longest segment loses tokens from its end
until they do (longest-first, as HF's `truncation="longest_first"`: on a tie the later
field loses the token); each cut field is
counted once per row in the `RowReport`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.inference.engine import pad

from ..row_report import SOURCE_TOO_LONG, RowReport


@dataclass
class HeadExample:
    input_ids: list[int]
    length: int
    label: object  # an index; a number (regression); a tuple of indices (multi-label); None: unlabeled
    split: int = 0


class HeadEncoder:
    def __init__(self, tokenizer, fields: Sequence[str], max_length: int):
        self.tokenizer = tokenizer
        self.fields = tuple(fields)
        self.max_length = int(max_length)
        self.ids = TokenIds.from_tokenizer(tokenizer)
        if self.ids.bos_id is None or self.ids.eos_id is None:
            raise ValueError("the tokenizer needs BOS and EOS ids (load it with load_tokenizer)")

    def encode(self, row: Mapping[str, str], label=None, *,
               report: RowReport | None = None, source="", line: int = 0) -> HeadExample | None:
        segments = [list(self.tokenizer(row[f], add_special_tokens=False)["input_ids"])
                    for f in self.fields]
        budget = self.max_length - 1 - len(segments)
        if budget < len(segments):
            if report is not None:
                report.drop_kept(SOURCE_TOO_LONG, source, line,
                                 f"{len(segments)} fields cannot fit in max_length={self.max_length}")
            return None
        cut = set()
        while sum(map(len, segments)) > budget:
            longest = max(range(len(segments)), key=lambda i: (len(segments[i]), i))
            segments[longest].pop()
            cut.add(self.fields[longest])
        if report is not None:
            for field in sorted(cut):
                report.truncate(field)
        ids = [self.ids.bos_id]
        for segment in segments:
            ids += segment + [self.ids.eos_id]
        return HeadExample(ids, len(ids), label)


def collate(examples: Sequence[HeadExample], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids [B, T] right-padded, lengths [B], labels [B] (-1 where unlabeled)."""
    input_ids, lengths = pad([e.input_ids for e in examples], pad_id, "cpu")
    return {"input_ids": input_ids, "lengths": lengths,
            "labels": torch.tensor([-1 if e.label is None else e.label for e in examples])}
