"""`GenerationConfig`: every decoding option of Mask-Predict generation, checked at construction.

Why one frozen dataclass: the CLI, lm-eval's `generate_until` kwargs and Python callers all map
onto it, so a typo or a meaningless combination fails here, once, with a message that says what
to do, instead of being silently ignored deep in the decoder.

The defaults are a contract that scripts depend on: greedy argmax,
`remask="low_confidence"`, one block, length beam 1, and no EOS cut when `length` is given.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from megatron_biglm.common.config_fields import ConfigError, build_dataclass, coerce

RemaskMode = Literal["low_confidence", "random", "none"]
BlockMode = Literal["refresh", "cached", "canvas"]
OverflowMode = Literal["error", "truncate_left"]
REMASK_MODES, BLOCK_MODES, OVERFLOW_MODES = (typing.get_args(t) for t in (RemaskMode, BlockMode, OverflowMode))


class GenerationConfigError(ConfigError):
    """A decoding option is invalid; the message names the option and how to fix it. A
    `ConfigError`: types, choices and unknown keys are checked by common/config_fields, as for
    every config."""


@dataclass(frozen=True)
class GenerationConfig:
    """Decoding options.

    steps: T, Mask-Predict iterations per block (T forward passes per block at most).
    length: fixed number N of generated slots; the output keeps all N (no EOS cut).
    max_new_tokens: decode N = max_new_tokens slots, then cut at the first EOS.
    length_beam: number of candidate lengths decoded in parallel; the candidate with the highest
      mean log-probability wins. Candidates come from the length predictor when the model has
      one and `length` is not given, else `length, length-1, length+1, length-2, ...`.
    block_size: B slots per block (None: one block). Blocks are decoded left to right; each is
      frozen and appended to the prefix before the next starts.
    blocks: "refresh" re-encodes prompt + finished blocks as one prefix after every block
      (training's single split); "cached" is block-causal, the prefix cache only grows (with
      `use_cache=False`, its uncached reference recomputes the same pattern every iteration);
      "canvas" is LLaDA's semi-autoregressive decoding: every iteration runs the whole canvas
      (prompt, finished blocks, the open block, a mask for every later slot) under full
      bidirectional attention, with no cache.
    remask: "low_confidence" re-masks the lowest-probability slots among all slots (the paper);
      "random" re-masks random slots; "none" never re-masks a committed slot (LLaDA) and
      commits the most confident predicted slots instead.
    temperature: 0 is greedy argmax; > 0 samples from softmax(logits / temperature), optionally
      restricted to the `top_k` tokens and/or the smallest set of mass `top_p`.
    confidence_threshold: every slot predicted with probability >= this is committed at once and
      never re-masked (Fast-dLLM); a block ends early when every slot passes.
    min_length: EOS cannot be generated in the first `min_length` slots.
    seed: seeds every random draw (sampling, random re-masking); see `mask_predict`.
    until: stop strings (one string is one stop string); the text is cut before the first one.
    return_steps: keep the canvas after every iteration in the output.
    batch_invariant: decode each prompt in its own forward passes, so a prompt gives the same ids
      alone or in any batch (costs the batching speed-up).
    overflow: when [BOS] + prompt + slots exceeds the model's positions, "error" refuses and
      "truncate_left" drops prompt tokens from the left (the output counts them).
    """

    steps: int = 10
    length: int | None = None
    max_new_tokens: int | None = None
    length_beam: int = 1
    block_size: int | None = None
    blocks: BlockMode = "refresh"
    remask: RemaskMode = "low_confidence"
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    confidence_threshold: float | None = None
    min_length: int = 0
    seed: int = 0
    until: tuple[str, ...] | str = ()  # a string is one stop string; always a tuple once built
    return_steps: bool = False
    batch_invariant: bool = False
    overflow: OverflowMode = "error"

    def __post_init__(self):
        for name, tp in _field_types().items():  # types and choices: the one coercion of every config
            object.__setattr__(self, name, coerce(getattr(self, name), tp, name, error=GenerationConfigError))
        if isinstance(self.until, str):  # one stop string
            object.__setattr__(self, "until", (self.until,))
        if any(s == "" for s in self.until):
            raise GenerationConfigError("until contains an empty string, which would stop at once; "
                                        "remove it")
        self._check_ints()
        self._check_sampling()

    def _check_ints(self) -> None:
        def integer(name, low, optional=False, why=""):
            value = getattr(self, name)
            if value is None and optional:
                return
            if value < low:
                raise GenerationConfigError(f"{name} must be >= {low}, got {value}{why}")

        integer("steps", 1, why=": T is the number of Mask-Predict iterations per block, use 1 or more")
        integer("length", 1, optional=True,
                why=": ask for at least one token, or leave length unset and use max_new_tokens")
        integer("max_new_tokens", 1, optional=True, why=": ask for at least one token")
        integer("length_beam", 1, why=": 1 decodes a single length")
        integer("block_size", 1, optional=True, why=": leave block_size unset for one block")
        integer("top_k", 1, optional=True, why=": leave top_k unset to keep every token")
        integer("min_length", 0)
        integer("seed", 0)
        if self.length is not None and self.max_new_tokens is not None:
            raise GenerationConfigError(
                "give either length (exactly N tokens, no EOS cut) or max_new_tokens (at most N, cut "
                "at the first EOS), not both")
        budget = self.length if self.length is not None else self.max_new_tokens
        if budget is not None and self.min_length > budget:
            raise GenerationConfigError(f"min_length={self.min_length} exceeds the {budget} tokens "
                                        "asked for; lower min_length or ask for more tokens")

    def _check_sampling(self) -> None:
        def number(name):
            value = getattr(self, name)
            if not math.isfinite(value):
                raise GenerationConfigError(f"{name} must be a finite number, got {value!r}")
            return value

        if number("temperature") < 0:
            raise GenerationConfigError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if self.top_p is not None and not 0.0 < number("top_p") <= 1.0:
            raise GenerationConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature == 0 and (self.top_k is not None or self.top_p is not None):
            raise GenerationConfigError(
                "top_k/top_p only apply when sampling; set temperature > 0 or drop them "
                "(temperature 0 is greedy argmax)")
        if self.confidence_threshold is not None and not 0.0 < number("confidence_threshold") <= 1.0:
            raise GenerationConfigError(
                f"confidence_threshold is a probability in (0, 1], got {self.confidence_threshold}")

    # ------------------------------------------------------------------ derived
    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def eos_cut(self) -> bool:
        """Cut at the first EOS: only with max_new_tokens or predicted lengths, never with `length`."""
        return self.length is None

    def check_length_source(self, has_length_predictor: bool) -> None:
        """Fail unless the lengths to decode are known: `length`, `max_new_tokens` or a predictor."""
        if self.length is not None:
            return
        if not has_length_predictor:
            if self.length_beam > 1:
                raise GenerationConfigError(
                    f"length_beam={self.length_beam} needs candidate lengths, but the model has no "
                    "length head and no length was given; pass length=N (candidates around N) or "
                    "length_beam=1")
            if self.max_new_tokens is None:
                raise GenerationConfigError(
                    "the model has no length head, so give length=N (exactly N tokens) or "
                    "max_new_tokens=N (at most N, cut at EOS)")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> "GenerationConfig":
        """Build from a mapping (CLI, lm-eval generation kwargs); an unknown key is an error that
        names the closest valid one, never silently ignored (common/config_fields' check)."""
        return build_dataclass(cls, values, "generation", error=GenerationConfigError,
                               headline="unknown generation option(s) {keys}")

    def replace(self, **changes: Any) -> "GenerationConfig":
        """A copy with `changes` applied (checked like `from_dict`)."""
        return type(self).from_dict({**dataclasses.asdict(self), **changes})

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["until"] = list(self.until)
        return out


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(GenerationConfig)
