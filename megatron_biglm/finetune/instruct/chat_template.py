"""The chat template of instruction tuning, and its encoding with a role per token.

A sample is laid out as

    [BOS] user instruction (separator input)? assistant TARGET end [EOS]

where `user`, `separator`, `assistant` and `end` are the template's literal strings. Each
piece is tokenised on its own and every token is tagged with its role
(`objective.instruct.TEMPLATE / INPUT / TARGET`): the masker reads the roles, so template
literals and special tokens are never masked, whatever the tokenizer does with them. The same
encoder lays out prompts for prompted classification (`encode_prompt`): the target is
replaced by `<mask>` slots, so fine-tuning and evaluation see exactly the instruction-tuning
layout (“Scaling Effects of Instruction Tuning” §3.2: "a prompt following the template introduced during instruction tuning").

Too long for `max_length`: the input text is cut at its end first, then the instruction;
each cut is counted by the caller (`Encoded.truncated`). The target is never cut.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from megatron_biglm.common.config_fields import build_dataclass
from megatron_biglm.data.token_ids import TokenIds
from megatron_biglm.objective.instruct import INPUT, TARGET, TEMPLATE


@dataclass(frozen=True)
class ChatTemplate:
    """The literal strings around the instruction, input and target (configurable)."""
    user: str = "### Instruction:\n"
    separator: str = "\n### Input:\n"
    assistant: str = "\n### Response:\n"
    end: str = ""

    @classmethod
    def from_dict(cls, values: dict | None) -> "ChatTemplate":
        return build_dataclass(cls, dict(values or {}), "template")

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Named templates: `default` (Alpaca-like headers) and `plain` (the bare question/answer
#: words the synthetic learnability test uses).
TEMPLATES = {
    "default": ChatTemplate(),
    "plain": ChatTemplate(user="question :", separator=" input :", assistant=" answer :", end=""),
}


def get_template(spec) -> ChatTemplate:
    """A ChatTemplate from a name in TEMPLATES, a dict of its fields, or itself."""
    if isinstance(spec, ChatTemplate):
        return spec
    if isinstance(spec, str):
        if spec not in TEMPLATES:
            raise ValueError(f"unknown chat template {spec!r}; known: {sorted(TEMPLATES)} (or give its fields)")
        return TEMPLATES[spec]
    return ChatTemplate.from_dict(spec)


def prompt_of(source: str, template) -> str:
    """What an instruction-tuned model is prompted with for one instruction: the source itself
    (no template), or `user + source + assistant` of the template (a name, fields, or itself),
    as training laid it out before the target."""
    if template is None:
        return source
    t = get_template(template)
    return t.user + source + t.assistant


@dataclass
class Encoded:
    """One laid-out sample: token ids, a role per token, where the target is, what was cut."""
    ids: np.ndarray
    roles: np.ndarray
    target_start: int
    target_end: int
    truncated: list = field(default_factory=list)


class TemplateEncoder:
    """Encodes (instruction, input, target) with one tokenizer and template."""

    def __init__(self, tokenizer, template="default", max_length: int = 512):
        self.tokenizer = tokenizer
        self.template = get_template(template)
        self.max_length = int(max_length)
        self.ids = TokenIds.from_tokenizer(tokenizer).require("bos_id", "eos_id", why="samples open with BOS and end with EOS")
        self._piece = {name: self.tokens(value) for name, value in self.template.to_dict().items()}

    def tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def fixed_length(self, has_input: bool) -> int:
        """Template and special tokens of one sample."""
        t = self._piece
        return 2 + len(t["user"]) + len(t["assistant"]) + len(t["end"]) + (len(t["separator"]) if has_input else 0)

    def encode(self, instruction: str, input_text: str, target_ids: list[int]) -> Encoded | None:
        """The sample, or None when even the template and target do not fit."""
        instruction_ids, input_ids = self.tokens(instruction), self.tokens(input_text)
        budget = self.max_length - self.fixed_length(bool(input_ids)) - len(target_ids)
        truncated = []
        if budget < 1:
            return None
        if len(instruction_ids) + len(input_ids) > budget:
            keep_input = max(0, budget - len(instruction_ids))
            if keep_input < len(input_ids):
                input_ids = input_ids[:keep_input]
                truncated.append("input")
            if len(instruction_ids) > budget - len(input_ids):
                instruction_ids = instruction_ids[:budget - len(input_ids)]
                truncated.append("instruction")
        t = self._piece
        pieces = [([self.ids.bos_id], TEMPLATE), (t["user"], TEMPLATE), (instruction_ids, INPUT)]
        if input_ids:
            pieces += [(t["separator"], TEMPLATE), (input_ids, INPUT)]
        pieces += [(t["assistant"], TEMPLATE), (list(target_ids), TARGET), (t["end"], TEMPLATE),
                   ([self.ids.eos_id], TEMPLATE)]
        ids = np.concatenate([np.asarray(p, dtype=np.int64) for p, _ in pieces])
        roles = np.concatenate([np.full(len(p), r, dtype=np.uint8) for p, r in pieces])
        start = int(np.flatnonzero(roles == TARGET)[0]) if len(target_ids) else len(ids)
        return Encoded(ids, roles, start, start + len(target_ids), truncated)

    def encode_prompt(self, instruction: str, input_text: str, num_slots: int) -> Encoded | None:
        """A prompted-classification input: the target replaced by `num_slots` `<mask>` ids
        (TARGET role); `target_start` is the first slot (the biglm split)."""
        return self.encode(instruction, input_text, [self.ids.mask_id] * num_slots)
