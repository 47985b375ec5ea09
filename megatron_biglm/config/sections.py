"""The run config's `model` and `objective` sections: kept as written, resolved and validated at load.

Why not store `BiGLMModelConfig` / `ObjectiveConfig` themselves: a run names a model as a
preset plus a few overrides, and an ablation writes only the objective keys it changes.
config.yaml saves exactly that (so `defaults:` bases and ablation diffs stay readable, and a
preset name stays a name), while the run needs the typed result. A section is therefore a
read-only mapping of what was written (values coerced to their field types), with the typed
value built from it (`.resolved`). Keys and values are checked when the config is loaded: a
misspelt objective or model key, or an objective the `ObjectiveConfig` rules refuse, fails in
`load_config`, before any process group exists, with the valid keys in the message.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import typing
from collections.abc import Mapping
from typing import Any, Iterator

from megatron_biglm.common.config_fields import ConfigError, coerce, qualify, unknown_key_error
from megatron_biglm.model.config import BiGLMModelConfig, ModelConfigError
from megatron_biglm.model.presets import load_preset
from megatron_biglm.objective.config import ObjectiveConfig

#: The preset a run gets when its config names none.
DEFAULT_PRESET = "tiny"


class _WrittenSection(Mapping):
    """A mapping of the keys as written (compares equal to a dict with the same items)."""

    def __init__(self, written: Mapping[str, Any]):
        self._written = copy.deepcopy(dict(written))

    def __getitem__(self, key: str) -> Any:
        return self._written[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._written)

    def __len__(self) -> int:
        return len(self._written)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._written!r})"

    def to_dict(self) -> dict:
        return copy.deepcopy(self._written)

    @classmethod
    def from_config(cls, value, key: str):
        """Hook of `common.config_fields.coerce`: build the section for field `key`."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(f"config section '{key}' must be a mapping, got {value!r}")
        return cls(value, section=key)


class ModelSection(_WrittenSection):
    """`model:`: `preset` (a preset name or a YAML path, default `tiny`) plus any
    `BiGLMModelConfig` field as an override; `.resolved` is the `BiGLMModelConfig`.

    Keys and override values are checked and typed at load. The preset file itself is read
    when the model is first needed (`.resolved`): a config may name a preset that exists only
    where the run is built (a base config for `defaults:`, a preset file made by an import)."""

    def __init__(self, written: Mapping[str, Any] | None = None, *, section: str = "model"):
        values = {"preset": DEFAULT_PRESET, **(written or {})}
        hints = typing.get_type_hints(BiGLMModelConfig)
        valid = ["preset", *(f.name for f in dataclasses.fields(BiGLMModelConfig))]
        unknown = [k for k in values if k not in valid]
        if unknown:
            raise unknown_key_error(section, unknown, valid, error=ModelConfigError)
        preset = values["preset"]
        if not isinstance(preset, (str, os.PathLike)) or not str(preset):
            raise ModelConfigError(f"config section '{section}' needs a 'preset' (a preset name such as "
                                   f"'{DEFAULT_PRESET}' or a YAML path), got {preset!r}")
        super().__init__({k: str(v) if k == "preset" else coerce(v, hints[k], qualify(section, k),
                                                                 error=ModelConfigError)
                          for k, v in values.items()})
        self._resolved: BiGLMModelConfig | None = None

    @property
    def overrides(self) -> dict:
        """The `BiGLMModelConfig` fields set here, on top of the preset's."""
        return {k: v for k, v in self.to_dict().items() if k != "preset"}

    def with_values(self, **values) -> "ModelSection":
        """This section with `values` set on top (`BiGLMModelConfig` fields, checked and typed
        as at load): how a run derives its model from another typed fact (a start checkpoint's
        shape, a recipe's head size) without writing keys as text."""
        return ModelSection({**self.to_dict(), **values})

    @property
    def resolved(self) -> BiGLMModelConfig:
        """The preset with the overrides applied (read once, then kept)."""
        if self._resolved is None:
            self._resolved = load_preset(self["preset"], self.overrides)
        return self._resolved


class ObjectiveSection(_WrittenSection):
    """`objective:`: the `ObjectiveConfig` keys that differ from the defaults; `.resolved` is
    the `ObjectiveConfig`, built (and validated) at load."""

    def __init__(self, written: Mapping[str, Any] | None = None, *, section: str = "objective"):
        self.resolved: ObjectiveConfig = ObjectiveConfig.from_dict(written, section)
        typed = self.resolved.to_dict()
        super().__init__({k: typed[k] for k in (written or {})})


__all__ = ["DEFAULT_PRESET", "ModelSection", "ObjectiveSection"]
