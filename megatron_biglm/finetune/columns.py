"""The columns of a labelled task as a declaration names them (its text `fields` and a label
column), what every classifying kind reads (`kinds/base.py`'s default `declared_schema`), and
the error every declaration check raises.
"""
from __future__ import annotations

from typing import Sequence

from megatron_biglm.common.config_fields import ConfigError

from .data_files import DatasetSchema, label_text, names_a_number

_LABEL_KIND = {"single_label_classification": "single", "regression": "regression",
               "multi_label_classification": "multi"}


class TaskDeclarationError(ConfigError):
    """A declared task is wrong; the message names the key and what it may be."""


def labelled_schema(spec, problem: str, common: dict, where: str) -> DatasetSchema:
    """The columns of a labelled task: its text `fields` and a label column (`labels`,
    `label_field`, `label_separator`), modelled as `problem`: what the classifying kinds read."""
    extra = (str(spec["id_field"]),) if spec.get("id_field") else ()
    fields = spec.get("fields")
    fields = tuple(str(f) for f in as_list(fields, f"{where}.fields")) if fields is not None else ()
    if not fields:
        raise TaskDeclarationError(f"{where}.fields: name the text column(s) the task reads, e.g. fields: [text]")
    labels = spec.get("labels")
    if labels is not None:
        labels = tuple(label_text(x) or str(x) for x in as_list(labels, f"{where}.labels"))  # 1.0 names label 1
        if len(set(labels)) != len(labels) or any(not x for x in labels):
            raise TaskDeclarationError(f"{where}.labels must be distinct non-empty names, got {list(labels)}")
    if problem == "regression" and labels is not None:
        raise TaskDeclarationError(f"{where}: a regression task has a number per row, not labels")
    return DatasetSchema(text_fields=fields, label_names=labels or (), unlabeled=None,
                         label_indices=not any(map(names_a_number, labels or ())),
                         label_field=str(spec.get("label_field", "label")), extra_fields=extra,
                         label_kind=_LABEL_KIND[problem], label_separator=str(spec.get("label_separator", ",")),
                         **common)


def as_list(value, key: str) -> list:
    """`value` as a list (a declaration key that takes several names); a string or a scalar is an error."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TaskDeclarationError(f"{key} must be a list, got {value!r}")
    return list(value)
