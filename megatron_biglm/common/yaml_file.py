"""The one YAML reader of config files: PyYAML's safe loader, except that a key written twice
in one mapping is refused, naming the key and both lines. PyYAML keeps the last and silently
drops the first (two `optimizer:` mappings lose the first one's settings)."""
from __future__ import annotations

import yaml


class DuplicateKeyError(yaml.YAMLError):
    """A mapping holds the same key twice; the message names the key and both lines."""


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:  # the keys written here (a `<<:` merge may be overridden)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: the base loader names it
                    break
                if first is not None:
                    raise DuplicateKeyError(
                        f"key {key!r} is written twice in one mapping, at line {first.line + 1} and "
                        f"line {key_node.start_mark.line + 1}; keep one (YAML would silently drop the first)")
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_yaml(stream):
    """The document in `stream` (text or an open file), as `yaml.safe_load` reads it, with
    duplicate keys refused (`DuplicateKeyError`, a `yaml.YAMLError`)."""
    return yaml.load(stream, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


__all__ = ["DuplicateKeyError", "load_yaml"]
