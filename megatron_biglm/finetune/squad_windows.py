"""SQuAD v1.1 features: question + context windows, with token <-> character offsets.

Layout of a window: `[BOS] question [EOS] context-window [EOS]`, at most `max_length`
tokens. The question is cut to `max_query_length` tokens (counted as a `question`
truncation). A context longer than the room left is split into overlapping windows;
`doc_stride` is the overlap in tokens between consecutive windows (HF `run_qa`'s `stride`;
the paper-style default 384/128), so an answer cut by one window's end lies whole in the
next one when it is at most `doc_stride` tokens long.

Offsets come from the fast tokenizer over the *whole* context (so a window's tokens are
exactly the context's tokens), and `offsets[i]` is the character span in the context of
input position i (None outside the context). Character -> token: the answer's first token is
the first one ending after the answer's start character, its last token the last one
starting before the answer's end, so tokens that also cover a leading space (byte-level
BPE) still count.

Training labels: `start_position`/`end_position` index input positions; a window that does
not hold the whole answer points both at 0 (the BOS position) and has `has_answer=False`,
BERT's convention; recipes may also drop such windows. An answer whose text is not at its
`answer_start` in the context is dropped and counted (`answer_not_in_context`). There is no
target suffix, so `split` is 0.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.inference.engine import pad

from .row_report import ANSWER_NOT_IN_CONTEXT, SOURCE_TOO_LONG, RowReport

NO_ANSWER_POSITION = 0


@dataclass
class SquadWindow:
    example_id: str
    window_index: int
    input_ids: list[int]
    offsets: list[tuple[int, int] | None]
    context_start: int                 # input position of the window's first context token
    start_position: int = NO_ANSWER_POSITION
    end_position: int = NO_ANSWER_POSITION
    has_answer: bool = False
    split: int = 0

    @property
    def length(self) -> int:
        return len(self.input_ids)


@dataclass
class SquadEncoder:
    tokenizer: object
    max_length: int = 384
    doc_stride: int = 128
    max_query_length: int = 64
    ids: TokenIds = field(init=False)

    def __post_init__(self):
        self.ids = TokenIds.from_tokenizer(self.tokenizer)
        if self.ids.bos_id is None or self.ids.eos_id is None:
            raise ValueError("the tokenizer needs BOS and EOS ids (load it with load_tokenizer)")
        if self.max_query_length < 1 or self.doc_stride < 0:
            raise ValueError("max_query_length must be >= 1 and doc_stride >= 0")

    def context_room(self, question_tokens: int) -> int:
        return self.max_length - 3 - question_tokens

    def encode(self, row: Mapping, *, training: bool = True, report: RowReport | None = None,
               source="", line: int = 0) -> list[SquadWindow]:
        """The windows of one SQuAD row (`id`, `question`, `context`, `answers`). With
        `training`, the first gold answer labels each window."""
        question = list(self.tokenizer(row["question"], add_special_tokens=False)["input_ids"])
        if len(question) > self.max_query_length:
            question = question[:self.max_query_length]
            if report is not None:
                report.truncate("question")
        context = row["context"]
        encoding = self.tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
        ctx_ids, ctx_offsets = list(encoding["input_ids"]), [tuple(o) for o in encoding["offset_mapping"]]
        room = self.context_room(len(question))
        if room <= self.doc_stride or room < 1:
            if report is not None:
                report.drop_kept(SOURCE_TOO_LONG, source, line,
                                 f"max_length={self.max_length} leaves {room} context tokens per "
                                 f"window, not more than doc_stride={self.doc_stride}")
            return []
        answer_tokens = None
        if training:
            answer_tokens = self._answer_tokens(row, context, ctx_offsets)
            if answer_tokens is None:
                if report is not None:
                    report.drop_kept(ANSWER_NOT_IN_CONTEXT, source, line,
                                     "answers.text[0] is not at answers.answer_start[0]")
                return []
        head = [self.ids.bos_id] + question + [self.ids.eos_id]
        windows = []
        for index, (start, end) in enumerate(window_bounds(len(ctx_ids), room, self.doc_stride)):
            window = SquadWindow(
                example_id=str(row.get("id", line)), window_index=index,
                input_ids=head + ctx_ids[start:end] + [self.ids.eos_id],
                offsets=[None] * len(head) + ctx_offsets[start:end] + [None],
                context_start=len(head))
            if answer_tokens is not None:
                first, last = answer_tokens
                if start <= first and last < end:
                    window.start_position = len(head) + first - start
                    window.end_position = len(head) + last - start
                    window.has_answer = True
            windows.append(window)
        return windows

    @staticmethod
    def _answer_tokens(row, context: str, offsets) -> tuple[int, int] | None:
        text, start_char = row["answers"]["text"][0], row["answers"]["answer_start"][0]
        end_char = start_char + len(text)
        if context[start_char:end_char] != text:
            return None
        inside = [i for i, (a, b) in enumerate(offsets) if b > a and a < end_char and b > start_char]
        if not inside:
            return None
        return inside[0], inside[-1]


def window_bounds(n_tokens: int, room: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) token ranges covering n_tokens, each at most `room` long, consecutive
    ranges overlapping by `overlap` tokens (the last range ends at n_tokens)."""
    if room <= overlap:
        raise ValueError(f"window room {room} must exceed the overlap {overlap}")
    bounds, start = [], 0
    while True:
        end = min(start + room, n_tokens)
        bounds.append((start, end))
        if end >= n_tokens:
            return bounds
        start = end - overlap


def collate(windows: Sequence[SquadWindow], pad_id: int) -> dict[str, torch.Tensor]:
    """input_ids [B, T] right-padded, lengths [B], start/end positions [B], has_answer [B]."""
    input_ids, lengths = pad([w.input_ids for w in windows], pad_id, "cpu")
    return {"input_ids": input_ids, "lengths": lengths,
            "start_positions": torch.tensor([w.start_position for w in windows]),
            "end_positions": torch.tensor([w.end_position for w in windows]),
            "has_answer": torch.tensor([w.has_answer for w in windows])}
