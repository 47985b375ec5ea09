"""Command-line flags generated from a config dataclass, so a command declares no field twice.

Why: a command that exposes a config's options as flags would otherwise repeat every name,
type, choice list and default, and drift from the dataclass. Here a field `top_k: int | None`
becomes `--top-k` with the field's default; its value is converted by `config_fields.coerce`
(the one conversion of every config), a `Literal` field gets its choices, a `tuple[X, ...]`
field is a repeatable flag, a bool field is `--x/--no-x`. An unknown flag is refused with the
same did-you-mean hint as an unknown config key.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Literal

from megatron_biglm.common.config_fields import ConfigError, coerce, did_you_mean


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_dataclass_flags(parser, cls, names: Sequence[str], *, helps: Mapping[str, str] | None = None,
                        exclusive: Sequence[Sequence[str]] = ()) -> tuple[str, ...]:
    """Add a flag for each field of `cls` in `names` to `parser` (a parser or an argument group),
    with the field's default; the fields of each tuple in `exclusive` go in one mutually exclusive
    group. Returns the names, for `flag_values`."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [name for name in names if name not in fields]
    if unknown:
        raise ConfigError(f"{cls.__name__} has no field(s) {unknown}{did_you_mean(unknown, list(fields))}")
    hints, helps = typing.get_type_hints(cls), helps or {}
    groups = {}
    for names_ in exclusive:  # one group per tuple
        group = parser.add_mutually_exclusive_group()
        groups.update({name: group for name in names_})
    for name in names:
        field = fields[name]
        default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        kwargs = _flag_kwargs(_flag_type(hints[name]), flag_name(name), default)
        text = helps.get(name, "")
        if default not in (None, (), []):
            text = f"{text} (default: {default})" if text else f"default: {default}"
        groups.get(name, parser).add_argument(flag_name(name), dest=name, help=text or None, **kwargs)
    return tuple(names)


def flag_values(args: argparse.Namespace, names: Sequence[str]) -> dict:
    """The values of the flags `add_dataclass_flags` added, by field name (for `build_dataclass`)."""
    return {name: getattr(args, name) for name in names}


def parse_flags(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but an unknown flag is refused naming the closest known one."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        known = sorted(set(re.findall(r"--[\w-]+", parser.format_help())))
        flags = [item.partition("=")[0] for item in extra if item.startswith("--")]
        parser.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(flags, known) if flags else ''}")
    return args


def _flag_type(tp):
    """The type a flag parses: an Optional field's non-None type (a flag's absence is None)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)][0]
    return tp


def _flag_kwargs(tp, flag: str, default) -> dict:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {"choices": list(typing.get_args(tp)), "default": default, "type": _parser(tp, flag)}
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction, "default": default}
    if origin in (tuple, list):
        return {"action": "append", "default": list(default or ()), "type": _parser(typing.get_args(tp)[0], flag),
                "metavar": flag[2:].upper().replace("-", "_")}
    return {"type": _parser(tp, flag), "default": default}


def _parser(tp, flag: str):
    def parse(text: str):
        try:
            return coerce(text, tp, flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(tp, "__name__", str(tp))
    return parse
