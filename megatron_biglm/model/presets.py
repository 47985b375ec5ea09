"""Named model presets: YAML files in `examples/configs/presets/` (Table 7 of the paper).

A preset file has a `model:` section (the `BiGLMModelConfig` fields) and an optional
`reference_training:` section holding the paper's training settings for that size, which run
configs copy from; the model ignores it. Keeping presets as plain files (not Python constants)
lets users copy one, edit it and pass its path wherever a preset name is accepted.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional

from megatron_biglm.common.yaml_file import DuplicateKeyError, load_yaml

from .config import BiGLMModelConfig, ModelConfigError

#: Where named presets live; `BIGLM_PRESET_DIR` points elsewhere (e.g. a site-wide copy).
PRESET_DIR = Path(
    os.environ.get("BIGLM_PRESET_DIR", Path(__file__).resolve().parents[2] / "examples" / "configs" / "presets")
)
_SECTIONS = ("model", "reference_training")
#: Spellings users reach for, mapped to file stems ("1.3b" -> "1p3b").
_ALIASES = {"1.3b": "1p3b", "3.5b": "3p5b", "124m": "trial_124m", "trial": "trial_124m"}


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name_or_path: "str | os.PathLike") -> Path:
    """The YAML file for a preset name ("136m", "1.3B", "tiny") or an existing file path."""
    as_path = Path(name_or_path)
    if as_path.suffix in (".yaml", ".yml") or as_path.exists():
        if not as_path.is_file():
            raise ModelConfigError(f"model preset file {str(as_path)!r} does not exist")
        return as_path
    key = str(name_or_path).strip().lower()
    key = _ALIASES.get(key, key)
    path = PRESET_DIR / f"{key}.yaml"
    if not path.is_file():
        raise ModelConfigError(
            f"unknown model preset {str(name_or_path)!r}; known presets in {PRESET_DIR}: "
            f"{preset_names()} (or pass a path to a YAML file)"
        )
    return path


def read_preset_file(name_or_path: "str | os.PathLike") -> dict:
    """The raw preset document: {'model': {...}, 'reference_training': {...}}."""
    path = preset_path(name_or_path)
    with open(path, encoding="utf-8") as fh:
        try:
            doc = load_yaml(fh) or {}
        except DuplicateKeyError as exc:
            raise ModelConfigError(f"preset {path}: {exc}") from None
    if not isinstance(doc, dict) or "model" not in doc:
        raise ModelConfigError(f"preset {path} must be a mapping with a 'model:' section")
    extra = [k for k in doc if k not in _SECTIONS]
    if extra:
        raise ModelConfigError(f"preset {path} has unknown top-level section(s) {extra}; allowed: {_SECTIONS}")
    return doc


def load_preset(
    name_or_path: "str | os.PathLike", overrides: Optional[Mapping[str, Any]] = None
) -> BiGLMModelConfig:
    """A `BiGLMModelConfig` from a preset name or YAML path, with field overrides applied."""
    doc = read_preset_file(name_or_path)
    values = dict(doc["model"] or {})
    values.setdefault("name", preset_path(name_or_path).stem)
    values.update(overrides or {})
    return BiGLMModelConfig.from_dict(values)


def reference_training(name_or_path: "str | os.PathLike") -> dict:
    """The paper's training settings stored with a preset (empty when the file has none)."""
    return dict(read_preset_file(name_or_path).get("reference_training") or {})
