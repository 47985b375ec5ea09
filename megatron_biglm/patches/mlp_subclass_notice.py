"""megatron-core 0.16's `TransformerLayer` passes `tp_group` only to an MLP spec whose module
*is* `MLP`; for a subclass (BiGLM's `model/mlp.py` `BiGLMMLP`) it logs, once per layer built,
"Unknown MLP type: <class '...ModuleSpec'>. Using default kwargs." (seen in 0.16.1; 0.19 no
longer checks). The default is right for a subclass of `MLP`: it resolves the tensor-parallel
group itself, the same group the layer would pass. The line is noise in every run's output,
so `apply()` adds a filter to that module's logger which drops it when the layer being built
holds an `MLP` subclass; the line for any other MLP module still shows.
"""
from __future__ import annotations

import logging
import sys

from ._patching import Patch, import_or_none
import inspect

LOGGER = "megatron.core.transformer.transformer_layer"
MESSAGE = "Unknown MLP type"


def _building_mlp_subclass() -> bool:
    """Whether the frame logging this line is a layer's `__init__` whose spec holds an `MLP` subclass."""
    from megatron.core.transformer.mlp import MLP  # lazy: start-up (megatron.core: 2.9 CPU s)

    frame = sys._getframe(1)
    while frame is not None:
        spec = frame.f_locals.get("submodules") if frame.f_code.co_name == "__init__" else None
        module = getattr(getattr(spec, "mlp", None), "module", None)
        if isinstance(module, type):
            return issubclass(module, MLP)
        frame = frame.f_back
    return False


class _DropSubclassNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (str(record.msg).startswith(MESSAGE) and _building_mlp_subclass())


def _apply() -> bool:
    layer = import_or_none(LOGGER)
    if layer is None or MESSAGE not in _source(layer):
        return False
    logger = logging.getLogger(LOGGER)
    if not any(isinstance(f, _DropSubclassNotice) for f in logger.filters):
        logger.addFilter(_DropSubclassNotice())
    return True


def _source(module) -> str:
    try:
        return inspect.getsource(module)
    except OSError:
        return ""


PATCH = Patch(name="mlp_subclass_notice", fixes=__doc__.split("\n\n")[0], apply=_apply)
