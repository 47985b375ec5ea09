"""Fill a text template with a row's fields and make it fit a token budget by cutting the
longest field -- tokenising the whole filled string every time, so the ids are exactly what
the tokenizer gives for the final text (no seams between separately tokenised pieces).

A token belongs to a field when its character span overlaps the field's span (byte-level
BPE offsets may include the leading space, which lies outside the field). Cutting keeps the
field's first k tokens (at least one) by cutting its text at the start of token k+1; the
loop re-tokenises until the text fits (one round, or two when a cut shifts a merge).
"""
from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Mapping, Sequence

_FORMATTER = string.Formatter()


def template_fields(template: str) -> tuple[str, ...]:
    """Field names of a `{field}` template, in order, without repeats."""
    names: list[str] = []
    for _, name, spec, conversion in _FORMATTER.parse(template):
        if name is None:
            continue
        if not name or spec or conversion:
            raise ValueError(f"template fields must be plain {{name}}, got {{{name}!{conversion}:{spec}}}")
        if name not in names:
            names.append(name)
    return tuple(names)


def render(template: str, values: Mapping[str, str]) -> tuple[str, dict[str, list[tuple[int, int]]]]:
    """The filled text and, per field, the character spans where its value landed."""
    out: list[str] = []
    spans: dict[str, list[tuple[int, int]]] = {}
    at = 0
    for literal, name, _, _ in _FORMATTER.parse(template):
        out.append(literal)
        at += len(literal)
        if name is not None:
            value = values[name]
            spans.setdefault(name, []).append((at, at + len(value)))
            out.append(value)
            at += len(value)
    return "".join(out), spans


@dataclass
class Fitted:
    text: str
    ids: list[int]
    truncated: tuple[str, ...]


def fit_template(tokenizer, template: str, values: Mapping[str, str], budget: int,
                 truncatable: Sequence[str] | None = None, max_rounds: int = 16) -> Fitted | None:
    """Token ids (no special tokens) of the filled template, at most `budget` long, cutting
    the longest truncatable field first; None if even one token per field does not fit."""
    values = dict(values)
    truncatable = tuple(truncatable) if truncatable is not None else template_fields(template)
    cut: list[str] = []
    for _ in range(max_rounds):
        text, spans = render(template, values)
        encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(encoding["input_ids"]), list(encoding["offset_mapping"])
        excess = len(ids) - budget
        if excess <= 0:
            return Fitted(text, ids, tuple(cut))
        owned = {f: _tokens_in(offsets, spans[f]) for f in truncatable if f in spans}
        candidates = [f for f, tokens in owned.items() if len(tokens) > 1]
        if not candidates:
            return None
        field = max(candidates, key=lambda f: (len(owned[f]), -truncatable.index(f)))
        keep = max(1, len(owned[field]) - excess)
        first_start = spans[field][0][0]
        cut_at = max(offsets[owned[field][keep]][0], first_start) - first_start
        values[field] = values[field][:cut_at].rstrip()
        if field not in cut:
            cut.append(field)
    return None


def _tokens_in(offsets, spans) -> list[int]:
    return [i for i, (a, b) in enumerate(offsets)
            if b > a and any(a < end and b > start for start, end in spans)]
