"""Seq2seq features: the source is the prefix, the target the suffix (XSUM, MSQG).

Layout: `[BOS] source target [EOS]?`, with `split = len([BOS] + source)`: source rows never
see the target, exactly as in pretraining, so at decoding time the source can be encoded
once and the target slots filled by Mask-Predict. `target_length` is the number of suffix
tokens (the target, plus EOS when `append_eos`): the class the length head is trained to
predict from the prefix, and the N that Mask-Predict decodes.

Length limits: `max_source_length` bounds `[BOS] + source`, `max_target_length` the
suffix. An over-long source is cut from its end (`overlong_source="truncate"`, counted as a
`source` truncation) or the row dropped (`"drop"`, counted as `source_too_long`); an
over-long target is cut and counted as a `target` truncation. A target that tokenises to
nothing is dropped as `empty_target`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.inference.engine import pad

from ..row_report import EMPTY_TARGET, SOURCE_TOO_LONG, RowReport


@dataclass
class Seq2SeqExample:
    input_ids: list[int]
    split: int
    target_length: int
    reference: str | None = None  # the target text as given (untruncated): what metrics compare with

    @property
    def length(self) -> int:
        return len(self.input_ids)


class Seq2SeqEncoder:
    def __init__(self, tokenizer, max_source_length: int, max_target_length: int, *,
                 append_eos: bool = False, overlong_source: str = "truncate"):
        if overlong_source not in ("truncate", "drop"):
            raise ValueError(f"overlong_source must be 'truncate' or 'drop', got {overlong_source!r}")
        if max_source_length < 2 or max_target_length < 1 + int(append_eos):
            raise ValueError("max_source_length must be >= 2 and max_target_length >= 1 (+1 for EOS)")
        self.tokenizer = tokenizer
        self.max_source_length = int(max_source_length)
        self.max_target_length = int(max_target_length)
        self.append_eos = append_eos
        self.overlong_source = overlong_source
        self.ids = TokenIds.from_tokenizer(tokenizer)
        if self.ids.bos_id is None or (append_eos and self.ids.eos_id is None):
            raise ValueError("the tokenizer needs a BOS id (and EOS with append_eos)")

    def prefix(self, source: str, *, report: RowReport | None = None, source_name="",
               line: int = 0) -> list[int] | None:
        """`[BOS] + source` ids within max_source_length (what decoding starts from)."""
        ids = list(self.tokenizer(source, add_special_tokens=False)["input_ids"])
        room = self.max_source_length - 1
        if len(ids) > room:
            if self.overlong_source == "drop":
                if report is not None:
                    report.drop_kept(SOURCE_TOO_LONG, source_name, line,
                                     f"{len(ids) + 1} source tokens > max_source_length={self.max_source_length}")
                return None
            ids = ids[:room]
            if report is not None:
                report.truncate("source")
        return [self.ids.bos_id] + ids

    def encode(self, source: str, target: str, *, report: RowReport | None = None,
               source_name="", line: int = 0) -> Seq2SeqExample | None:
        target_ids = list(self.tokenizer(target, add_special_tokens=False)["input_ids"])
        if not target_ids:
            if report is not None:
                report.drop_kept(EMPTY_TARGET, source_name, line, "the target tokenises to nothing")
            return None
        prefix = self.prefix(source, report=report, source_name=source_name, line=line)
        if prefix is None:
            return None
        room = self.max_target_length - int(self.append_eos)
        if len(target_ids) > room:
            target_ids = target_ids[:room]
            if report is not None:
                report.truncate("target")
        suffix = target_ids + ([self.ids.eos_id] if self.append_eos else [])
        return Seq2SeqExample(prefix + suffix, len(prefix), len(suffix), reference=target)


def collate(examples: Sequence[Seq2SeqExample], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids [B, T] right-padded, lengths [B], split [B], target_lengths [B]."""
    input_ids, lengths = pad([e.input_ids for e in examples], pad_id, "cpu")
    return {"input_ids": input_ids, "lengths": lengths,
            "split": torch.tensor([e.split for e in examples]),
            "target_lengths": torch.tensor([e.target_length for e in examples])}
