"""What `MaskPredictGenerator.generate` returns per prompt, and how to show a canvas.

The ids are the generated token ids after the cuts (EOS with `max_new_tokens`, then `until`);
`confidence[i]` is the probability the model gave `ids[i]` when it was last predicted (the value
re-masking ranked). `candidates` keeps every length of the length beam with its score (mean
token log-probability plus the length predictor's log-probability of that length), so the
choice of the winner can be checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class CanvasStep:
    """All N slots of the winning candidate after iteration `iteration` of block `block`;
    masked slots (and blocks not started yet) hold the mask id."""

    block: int
    iteration: int
    ids: tuple[int, ...]


@dataclass
class GenerationOutput:
    prompt: str
    text: str
    ids: list[int]
    confidence: list[float]
    iterations: int  # forward passes over the slots of the winning candidate, all blocks
    finish_reason: str  # "length" (all slots kept), "eos" (cut at EOS), "stop" (an `until` string)
    length: int  # slots decoded for the winner (before any cut)
    candidates: list[tuple[int, float]] = field(default_factory=list)  # (length, score)
    steps: list[CanvasStep] | None = None
    prompt_tokens_dropped: int = 0  # prompt tokens cut from the left to fit (overflow="truncate_left")

    def to_json(self) -> dict:
        """One JSON row (the CLI's `--output` format): at least prompt, text and ids."""
        row = {"prompt": self.prompt, "text": self.text, "ids": self.ids,
               "confidence": self.confidence, "iterations": self.iterations,
               "finish_reason": self.finish_reason, "length": self.length,
               "candidates": [list(c) for c in self.candidates],
               "prompt_tokens_dropped": self.prompt_tokens_dropped}
        if self.steps is not None:
            row["steps"] = [{"block": s.block, "iteration": s.iteration, "ids": list(s.ids)}
                            for s in self.steps]
        return row


def render_canvas(tokenizer, ids, mask_id: int, mask_text: str = "_") -> str:
    """The canvas as text: runs of committed tokens decoded, each masked slot as `mask_text`."""
    parts, run = [], []
    for token in ids:
        if token == mask_id:
            if run:
                parts.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            parts.append(mask_text)
        else:
            run.append(int(token))
    if run:
        parts.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(parts)
