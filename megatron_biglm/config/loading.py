"""Reading a run config: YAML files with `defaults:` bases, `section.key=value` overrides and
`${VAR}` / `${VAR:-default}` environment references, then the typed `RunConfig`.

Why here and not in the dataclasses' module: how a config is written down (files, bases,
CLI, environment) changes independently of what a run config holds (run_config.py).
Every value goes through `common.config_fields.build_dataclass`, so a typo or a value of
the wrong type fails in `load_config`, naming the key, before any process group exists.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml

from megatron_biglm.common.config_fields import ConfigError, build_dataclass
from megatron_biglm.common.yaml_file import DuplicateKeyError, load_yaml

from .finetune_section import migrate_moved_keys, refuse_moved_keys
from .run_config import RunConfig, validate


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` → (['a','b','c'], YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. optimizer.lr=3e-4)")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except DuplicateKeyError as exc:
        raise ConfigError(f"override {text!r}: {exc}") from None
    except yaml.YAMLError:
        value = raw
    return parts, value


def _apply_override(tree: dict, parts: list[str], value: Any) -> None:
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(parts)}: '{part}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def _merge_defaults(tree: dict, base_dir: Path) -> dict:
    """`defaults: [other.yaml, ...]` (paths relative to this file) are merged under the file:
    how the paper's ablations are written as small overrides of one base config."""
    bases = tree.pop("defaults", None) or []
    merged: dict = {}
    for base in ([bases] if isinstance(bases, str) else bases):
        path = (base_dir / base) if not os.path.isabs(base) else Path(base)
        _deep_update(merged, load_yaml_tree(path))
    _deep_update(merged, tree)
    return merged


def _deep_update(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _deep_update(dst[key], value)
        else:
            dst[key] = value


_ENV_REF = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def expand_env(value, where: str = ""):
    """`${VAR}` / `${VAR:-default}` in config strings, so launch scripts and clusters can
    point a shared config at their own data paths. An unset VAR without default fails."""
    if isinstance(value, dict):
        return {k: expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, where) for v in value]
    if not isinstance(value, str) or "${" not in value:
        return value

    def sub(match):
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise ConfigError(f"config key '{where}' uses ${{{name}}} but the environment variable {name} "
                          f"is not set; export it or write ${{{name}:-default}}")
    return _ENV_REF.sub(sub, value)


def load_yaml_tree(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    with open(path, encoding="utf-8") as f:
        try:
            tree = load_yaml(f) or {}
        except DuplicateKeyError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return _merge_defaults(tree, path.parent)


def load_config(source=None, overrides: list[str] | tuple = ()) -> RunConfig:
    """A RunConfig from a YAML path, a dict or None (defaults), then `key=value` overrides."""
    if source is None:
        tree: dict = {}
    elif isinstance(source, RunConfig):
        tree = source.to_dict()
    elif isinstance(source, dict):
        tree = _merge_defaults(dict(source), Path.cwd())
    else:
        tree = load_yaml_tree(source)
    tree = _copy_tree(tree)
    for text in overrides:
        parts, value = parse_override(text)
        _apply_override(tree, parts, value)
    tree = expand_env(tree)
    refuse_moved_keys(tree.get("finetune"))
    config = build_dataclass(RunConfig, tree, "")
    validate(config)
    return config


def load_saved_config(path) -> RunConfig:
    """The config.yaml a run saved, read as `load_config` reads any, after the one migration of
    keys that moved since (`finetune_section.migrate_moved_keys`), so a checkpoint saved before
    reads as one saved now."""
    tree = load_yaml_tree(path)
    if isinstance(tree.get("finetune"), dict):
        tree["finetune"] = migrate_moved_keys(tree["finetune"], str(path))
    return load_config(tree)


def _copy_tree(tree):
    if isinstance(tree, dict):
        return {k: _copy_tree(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_copy_tree(v) for v in tree]
    return tree

