"""Bookkeeping shared by the patches: find a target, replace it once, log what happened.

Why: megatron-core changes between releases (0.16.1 here, newer on GPU clusters). A patch
whose target is gone in some version must say so ("not needed") and carry on, never crash
the run that imported it.
"""
from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("megatron_biglm.patches")

# Marker set on every replacement we install, so a second application is a no-op.
PATCHED_MARK = "__biglm_patch__"


@dataclass(frozen=True)
class Patch:
    """A named workaround: `apply()` installs it and returns False when it is not needed."""

    name: str
    fixes: str  # the exact failure it fixes, and the versions it was seen in
    apply: Callable[[], bool]


def import_or_none(module_name: str) -> Optional[Any]:
    """The module, or None (logged) when this megatron-core version does not have it."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        log.info("patch target %s missing in this version (%s): not needed", module_name, exc)
        return None


def replace_attr(owner: Any, attr: str, make_replacement: Callable[[Any], Any], patch: str) -> bool:
    """Replace `owner.attr` with `make_replacement(original)` unless already replaced.

    Returns True when the replacement is (now or already) installed, False (logged) when
    the attribute does not exist in this version.
    """
    original = getattr(owner, attr, None)
    if original is None:
        log.info("%s: %s.%s not found in this version: not needed", patch, _name(owner), attr)
        return False
    if getattr(original, PATCHED_MARK, None) == patch:
        return True
    replacement = make_replacement(original)
    try:
        setattr(replacement, PATCHED_MARK, patch)
    except (AttributeError, TypeError):  # e.g. a bound builtin; idempotence then rests on callers
        pass
    setattr(owner, attr, replacement)
    log.debug("%s: replaced %s.%s", patch, _name(owner), attr)
    return True


def _name(owner: Any) -> str:
    return getattr(owner, "__name__", type(owner).__name__)
