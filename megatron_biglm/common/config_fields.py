"""The one way a config dataclass is built from YAML/CLI values: typed coercion + unknown keys.

Why one mechanism: the run config, the model config and the objective config are all
written by hand in YAML files and `section.key=value` overrides. YAML 1.1 reads `6e-4` as a
string and users write `2048.0` for an int; a typo must fail at start naming the section,
the key, a close match and the valid keys, not silently fall back to a default. Every config
dataclass goes through `build_dataclass`, so these rules (and their messages) are the same
everywhere.

Non-finite numbers (inf, nan) are refused, naming the key. Supported field types: bool, int, float, str, Literal[...], Optional/Union, list/dict (bare
or parameterised), tuple[...] (fixed length or `tuple[X, ...]`), nested dataclasses (built
recursively, a missing/empty section meaning all defaults), `Any`, and section types that
build themselves: a class with a classmethod `from_config(value, key)` (a section whose keys
another package owns, e.g. the run config's `model` and `objective`).
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal

_NULLS = ("null", "none", "~")


@typing.runtime_checkable
class SelfBuildingSection(typing.Protocol):
    """A section type whose keys another package owns: it builds itself from the written
    value (the run config's `model` and `objective`)."""

    @classmethod
    def from_config(cls, value, key: str): ...
_TRUE, _FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


class ConfigError(ValueError):
    """A config file or override is wrong; the message says which key and how to fix it."""


def qualify(section: str, key: object) -> str:
    """`section.key` (just `key` at the top level): how messages name a key."""
    return f"{section}.{key}" if section else str(key)


def unknown_key_error(section: str, unknown: Sequence, valid: Sequence[str], *, error=ConfigError,
                      headline: str = "unknown config key {first!r}") -> ConfigError:
    """The error for keys a section does not have: names them, suggests the closest valid
    key for each, and lists the section's valid keys.

    `headline` may use `{first}` (the first unknown key, qualified) and `{keys}` (the sorted
    list of unknown names); classes whose wording users already match on keep theirs."""
    names = [str(k) for k in unknown]
    head = headline.format(first=qualify(section, names[0]), keys=sorted(names))
    return error(f"{head}{did_you_mean(names, valid)}; valid keys in {section or 'the top level'}: "
                 f"{', '.join(valid)}")


def did_you_mean(names: Sequence[str], valid: Sequence[str]) -> str:
    """` (did you mean 'x'?)` for the closest valid name to each unknown one; '' when none is close.
    The one hint of every config key and command-line flag."""
    close = {name: difflib.get_close_matches(name, list(valid), n=1) for name in names}
    close = {name: match[0] for name, match in close.items() if match}
    if len(names) == 1 and close:
        return f" (did you mean '{close[names[0]]}'?)"
    if close:
        return " (did you mean " + ", ".join(f"'{m}' for '{n}'" for n, m in close.items()) + "?)"
    return ""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _is_null(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _NULLS)


def coerce(value: Any, tp, key: str, *, error=ConfigError) -> Any:
    """`value` converted to the annotated type `tp`, or `error` naming `key` and the type."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin is typing.Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        if len(options) < len(args) and _is_null(value):
            return None
        first_error = None
        for option in options:
            try:
                return coerce(value, option, key, error=error)
            except ConfigError as exc:
                first_error = first_error or exc
        raise first_error
    if origin is Literal:
        for choice in args:
            if value == choice or (isinstance(value, str) and str(choice) == value):
                return choice
        raise error(f"config key '{key}': {value!r} is not one of {list(args)}")
    if isinstance(tp, type) and issubclass(tp, SelfBuildingSection):
        return tp.from_config(value, key)
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, key, error=error)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        raise error(f"config key '{key}': expected true/false, got {value!r}")
    if tp in (int, float):
        return _number(value, tp, key, error)
    if tp is str:
        if value is None or isinstance(value, (dict, list, tuple)):
            raise error(f"config key '{key}': expected a string, got {value!r}")
        return str(value)
    if tp in (list, dict) or origin in (list, dict):
        kind = origin or tp
        if not isinstance(value, kind):
            raise error(f"config key '{key}': expected a {kind.__name__}, got {value!r}")
        if kind is list and args:
            return [coerce(v, args[0], f"{key}[{i}]", error=error) for i, v in enumerate(value)]
        if kind is dict and len(args) == 2:
            return {coerce(k, args[0], key, error=error): coerce(v, args[1], qualify(key, k), error=error)
                    for k, v in value.items()}
        return value
    if tp is tuple or origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise error(f"config key '{key}': expected a list, got {value!r}")
        if not args:
            return tuple(value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(v, args[0], f"{key}[{i}]", error=error) for i, v in enumerate(value))
        if len(value) != len(args):
            raise error(f"config key '{key}': expected {len(args)} values, got {list(value)!r}")
        return tuple(coerce(v, a, f"{key}[{i}]", error=error) for i, (v, a) in enumerate(zip(value, args)))
    raise error(f"config key '{key}': unsupported type {_type_name(tp)}")  # pragma: no cover


def _number(value, tp, key: str, error):
    not_a_number = error(f"config key '{key}': expected {tp.__name__}, got {value!r}: it must be a number")
    if isinstance(value, bool) or value is None:
        raise not_a_number
    if isinstance(value, int):  # exact, however large
        return value if tp is int else float(value)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise not_a_number from None
    if not math.isfinite(number):  # lr=inf trains on NaN losses; nan compares false to every bound check
        raise error(f"config key '{key}': {value!r} is not a finite number; give a finite value")
    if tp is float:
        return number
    if not number.is_integer():
        raise error(f"config key '{key}': expected int (a whole number), got {value!r}")
    return int(number)


def build_dataclass(cls, data, section: str = "", *, error=ConfigError,
                    headline: str = "unknown config key {first!r}"):
    """`cls(**data)` with every value coerced to its field's type; unknown keys and missing
    required keys fail naming the section. `None` means an empty section (all defaults)."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise error(f"config section '{section or 'root'}' must be a mapping, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise unknown_key_error(section, unknown, list(fields), error=error, headline=headline)
    missing = [name for name, f in fields.items() if name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise error(f"config section '{section or 'root'}' is missing required key(s): {missing}")
    hints = typing.get_type_hints(cls)
    return cls(**{k: coerce(v, hints[k], qualify(section, k), error=error) for k, v in data.items()})


__all__ = ["ConfigError", "build_dataclass", "coerce", "did_you_mean", "qualify", "unknown_key_error"]
