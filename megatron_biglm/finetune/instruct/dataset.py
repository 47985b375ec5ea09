"""The tokenized instruction dataset: build once, save as .npy files, read by global sample.

`build_instruction_data` reads and filters rows (`rows.py`), lays each out with the chat
template (`chat_template.py`) and keeps the flat arrays:

    tokens  int32 [total]    every sample's ids, back to back
    roles   uint8 [total]    TEMPLATE / INPUT / TARGET per token (what the masker reads)
    offsets int64 [n + 1]    sample i is tokens[offsets[i]:offsets[i + 1]]
    target  int32 [n, 2]     [start, end) of sample i's target, relative to its start

`save(dir)` writes them with `meta.json` (template, filters, tokenizer, the row report);
`InstructionData.load(dir)` memory-maps them back. `InstructionSamples` is the training view:
global sample g is the example the one epoch order (`finetune/epochs.py`) draws for g, masked by `objective.instruct.mask_instruction` with a generator seeded by
(seed, g): a pure function of g, so `consumed_samples` resumes it exactly.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.objective.instruct import INPUT_MASK_RATIO, mask_instruction

from ..epochs import EpochOrder
from ..row_report import SOURCE_TOO_LONG
from .chat_template import TemplateEncoder, get_template
from .rows import InstructionReport, read_instruction_rows

_ARRAYS = ("tokens", "roles", "offsets", "target")


@dataclass
class InstructionData:
    tokens: np.ndarray
    roles: np.ndarray
    offsets: np.ndarray
    target: np.ndarray
    meta: dict

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return np.asarray(self.tokens[lo:hi]), np.asarray(self.roles[lo:hi])

    @property
    def max_length(self) -> int:
        return int(np.diff(self.offsets).max()) if len(self) else 0

    def save(self, folder) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        for name in _ARRAYS:
            np.save(folder / f"{name}.npy", getattr(self, name))
        (folder / "meta.json").write_text(json.dumps(self.meta, indent=1, ensure_ascii=False) + "\n")
        return folder

    @classmethod
    def load(cls, folder) -> "InstructionData":
        folder = Path(folder)
        missing = [n for n in (*_ARRAYS, "meta") if not (folder / f"{n}.{'json' if n == 'meta' else 'npy'}").is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} is not an instruction dataset (missing {missing}); build it with "
                                    "`python -m megatron_biglm.cli.instruct_data build ...`")
        arrays = {n: np.load(folder / f"{n}.npy", mmap_mode="r") for n in _ARRAYS}
        return cls(**arrays, meta=json.loads((folder / "meta.json").read_text()))


def from_encoded(encoded: list, meta: dict) -> InstructionData:
    lengths = [len(e.ids) for e in encoded]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    cat = (lambda arrays, dtype: np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype))
    return InstructionData(
        tokens=cat([e.ids for e in encoded], np.int32), roles=cat([e.roles for e in encoded], np.uint8),
        offsets=offsets, target=np.asarray([[e.target_start, e.target_end] for e in encoded], dtype=np.int32).reshape(-1, 2),
        meta=meta)


def build_instruction_data(inputs, tokenizer, *, template="default", max_length: int = 512,
                           max_target_tokens: int | None = None, languages=("en",),
                           report: InstructionReport | None = None, strict: bool = False) -> tuple[InstructionData, InstructionReport]:
    """Read, filter and encode every row; rows whose template + target alone exceed
    `max_length` are dropped as `source_too_long`, cut inputs counted as truncations."""
    report = report if report is not None else InstructionReport(strict=strict)
    encoder = TemplateEncoder(tokenizer, template, max_length)
    encoded = []
    for row, target_ids in read_instruction_rows(inputs, report=report, languages=languages,
                                                 max_target_tokens=max_target_tokens, tokenizer=tokenizer):
        sample = encoder.encode(row.instruction, row.input, target_ids)
        if sample is None:
            report.drop_kept(SOURCE_TOO_LONG, row.source, row.line, f"template + target exceed max_length={max_length}")
            continue
        for name in sample.truncated:
            report.truncate(name)
        encoded.append(sample)
    if not encoded:
        raise ValueError(f"no instruction sample survived: {report.summary_line()}; check the files, "
                         "the language filter and max_target_tokens")
    meta = {"template": get_template(template).to_dict(), "max_length": max_length,
            "max_target_tokens": max_target_tokens, "languages": list(languages or []),
            "tokenizer": str(getattr(tokenizer, "name_or_path", "")), "samples": len(encoded),
            "report": report.as_dict()}
    return from_encoded(encoded, meta), report


class InstructionSamples(torch.utils.data.Dataset):
    """`count` masked samples (global indices first .. first + count − 1), right-padded to
    `seq_length` (`valid_lengths` says where the real tokens end)."""

    def __init__(self, data: InstructionData, count: int, seq_length: int, ids: TokenIds, *, seed: int,
                 global_batch: int,
                 variant: str = "biglm", ratio: float = INPUT_MASK_RATIO, first: int = 0):
        if len(data) == 0:
            raise ValueError("the instruction dataset is empty")
        if data.max_length > seq_length:
            raise ValueError(f"an instruction sample has {data.max_length} tokens > data.seq_length={seq_length}; "
                             "rebuild the dataset with --max-length <= seq_length, or raise data.seq_length")
        self.data, self.count, self.seq_length, self.ids = data, int(count), int(seq_length), ids
        self.seed, self.variant, self.ratio, self.first = int(seed), variant, float(ratio), int(first)
        self.pad_id = ids.pad_id
        # the one epoch order (finetune/epochs.py); stream 0 here, stream 1 is the masking
        self.order = EpochOrder(len(data), global_batch, self.seed, stream=(0,))

    def __len__(self) -> int:
        return self.count

    def example_index(self, i: int) -> int:
        return self.order(self.first + int(i))

    def __getitem__(self, i: int) -> dict:
        g = self.first + int(i)
        tokens, roles = self.data.sample(self.example_index(i))
        out = mask_instruction(tokens, roles, np.random.default_rng([self.seed, 1, g]), self.ids.mask_id,
                               special_ids=self.ids.special_ids, ratio=self.ratio, variant=self.variant)
        n = len(tokens)
        padded = {"tokens": np.full(self.seq_length, self.pad_id, np.int64),
                  "labels": np.full(self.seq_length, -100, np.int64),
                  "loss_mask": np.zeros(self.seq_length, np.float32)}
        padded["tokens"][:n], padded["labels"][:n], padded["loss_mask"][:n] = out["input_ids"], out["labels"], out["loss_mask"]
        sample = {k: torch.from_numpy(v) for k, v in padded.items()}
        sample.update(split=int(out["split"]), valid_lengths=n)
        return sample
