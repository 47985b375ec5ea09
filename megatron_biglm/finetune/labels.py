"""The one label rule: a label is the value a cell holds, the same in every format.

`label_text` is the name a value spells: 0, 0.0, "0" and "0.0" are the number 0 whether they
come from jsonl, parquet or the text of a csv/tsv cell; a boolean is True or False; any other
string is itself, stripped. Labels inferred from a training split (`inferred_labels`) are its
distinct names in `label_order`, and must be of one kind: numbers, booleans or names. A column
mixing kinds (1 with true; 0 with pos) is refused with each value and its count, since the
mix is far more often a mistake than a label set; `labels:` listing them all accepts it. A
mapping or a list is no label name and is named as such (a list suggests several labels a row:
`problem_type: multi_label_classification`).
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Iterable, Sequence

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
_BOOLEANS = ("true", "false")

NUMBER, BOOLEAN, NAME = "number", "boolean", "name"


def label_text(value) -> str | None:
    """The label name a value spells, the same in every format: a number in its shortest form
    (an integral value as an integer: 2.0 and "2.0" are "2"; "0.50" is "0.5"), a boolean as True
    or False, any other string stripped; None for what names no label (a list, a mapping, NaN)."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in _BOOLEANS:
            return text.capitalize()
        if _INTEGER.fullmatch(text):
            return str(int(text))
        if _NUMBER.fullmatch(text):
            number = float(text)
            return label_text(number) if math.isfinite(number) else text
        return text
    return None


def names_a_number(name: str) -> bool:
    """Whether a label name is a number written out (2, -1, 0.5, 1e3)."""
    return bool(_NUMBER.fullmatch(name))


def label_order(names) -> tuple[str, ...]:
    """Distinct label names in their one order: names of numbers first, by value (0, 2, 10),
    then the others sorted; so ids never depend on the order of the rows."""
    names = set(names)
    numbers = sorted(filter(names_a_number, names), key=lambda n: (float(n), n))
    return tuple(numbers) + tuple(sorted(names - set(numbers)))


def kind_of(value, text: str) -> str:
    """number, boolean or name: what kind of label a value with the name `text` is."""
    if isinstance(value, bool) or text.lower() in _BOOLEANS:
        return BOOLEAN
    return NUMBER if names_a_number(text) else NAME


class LabelValueError(ValueError):
    """A label column that does not spell one set of labels; the message says why and what to set."""


def inferred_labels(values: Sequence, field: str, *, multi: bool = False, separator: str = ",") -> tuple[str, ...]:
    """The label names a training split's column `values` holds, in `label_order`.

    Refused (LabelValueError): values of more than one kind (numbers, booleans, names), each
    named with its count; and a column of mappings (or of lists, unless `multi`: several labels
    a row) that leaves too few label names, named as such. A few such rows among names are bad
    rows, dropped and counted when the split is read."""
    structured = [v for v in values if isinstance(v, dict) or (isinstance(v, (list, tuple)) and not multi)]
    if multi:
        values = [v for row in values if not isinstance(row, dict)
                  for v in (row.split(separator) if isinstance(row, str)
                            else row if isinstance(row, (list, tuple)) else [row])]
    named = [(v, label_text(v)) for v in values]
    named = [(v, t) for v, t in named if t]
    kinds: dict[str, Counter] = {}
    for value, text in named:
        kinds.setdefault(kind_of(value, text), Counter())[text] += 1
    if len(kinds) > 1:
        shown = "; ".join(f"{kind}s " + ", ".join(f"{t!r} x{n}" for t, n in counts.most_common(6))
                          + (" ..." if len(counts) > 6 else "") for kind, counts in sorted(kinds.items()))
        raise LabelValueError(
            f"the {field!r} column mixes kinds of labels ({shown}): a typo or a stray value is likely; fix the "
            f"rows, or list every label in finetune.task.labels to use them all as they are")
    names = label_order(text for _, text in named)
    if structured and len(names) < (1 if multi else 2):
        dicts = [v for v in structured if isinstance(v, dict)]
        if dicts:
            raise LabelValueError(
                f"the {field!r} column holds mappings ({len(dicts)} rows, e.g. {_short(dicts[0])}), not label names: "
                "a label is one name or number per row; set finetune.task.label_field to the column that holds "
                "it, or write the label itself")
        raise LabelValueError(
            f"the {field!r} column holds lists ({len(structured)} rows, e.g. {_short(structured[0])}), not one label "
            "per row: for several labels per row set finetune.task.problem_type: multi_label_classification "
            "(kind head)")
    return names


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def listed_labels(labels: Iterable) -> tuple[str, ...]:
    """The names of labels a declaration lists (`labels:`), by the same rule as the rows' values."""
    return tuple(label_text(x) or str(x) for x in labels)
