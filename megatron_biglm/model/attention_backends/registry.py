"""The registered attention backends, the `auto` preference, and the one resolution of a
configured name to a backend.

A new backend is one file in this package (an `AttentionBackend`, see `protocol.py`) and one
line in `BACKENDS` below; outside the package, `register_backend(MyBackend())`, or name it in
the config as `module:Class`.
"""
from __future__ import annotations

import importlib

import torch

from megatron_biglm.common.config_fields import did_you_mean

from .flash import FlashBackend
from .flex import FlexBackend
from .local import LocalBackend
from .protocol import AttentionBackend
from .sdpa import SdpaBackend
from .sdpa_split import SdpaSplitBackend
from .varlen import VarlenBackend

BACKENDS: dict[str, AttentionBackend] = {}

#: what `auto` picks: the first that runs here, in the model's dtype and attention dropout.
#: The kernels that skip the masked pairs before the one that skips masked blocks, before
#: the dense mask.
AUTO_PREFERENCE = ["flash", "varlen", "flex", "sdpa"]

_DTYPE_WORDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def register_backend(backend: AttentionBackend, *, name: str | None = None) -> AttentionBackend:
    """Make `backend` selectable as `model.attention_backend: NAME` (its `name`, or `name`)."""
    if not isinstance(backend, AttentionBackend):
        raise TypeError(f"{backend!r} is not an AttentionBackend (name, dtypes, supports_dropout, "
                        "megatron_native, unavailable, derive, forward, describe)")
    key = name or backend.name
    if key == "auto":
        raise ValueError("'auto' is the preference list, not a backend name")
    BACKENDS[key] = backend
    return backend


for _builtin in (SdpaBackend(), LocalBackend(), FlexBackend(), FlashBackend(), SdpaSplitBackend(),
                 VarlenBackend()):
    register_backend(_builtin)


def backend_names() -> tuple[str, ...]:
    """What `model.attention_backend` may name (besides a `module:Class`)."""
    return ("auto", *BACKENDS)


def get_backend(name: str) -> AttentionBackend:
    """The registered backend `name`; a `module:Class` is imported, instantiated and registered
    under that string. ValueError naming the registered ones (and the nearest) otherwise."""
    backend = BACKENDS.get(name)
    if backend is not None:
        return backend
    if isinstance(name, str) and name.count(":") == 1:
        module_name, _, attr = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"attention backend {name!r}: cannot import it ({exc})") from None
        return register_backend(cls(), name=name)
    raise ValueError(f"attention backend {name!r} is not one of {backend_names()}{did_you_mean([name], backend_names())}"
                     ", or a 'module:Class' of your own")


def check_backend_name(name: str, attention_dropout: float = 0.0) -> None:
    """ValueError when `name` names no backend, or one without attention dropout while the
    model has some (refused at config load, not at the first forward)."""
    if name == "auto":
        return
    backend = get_backend(name)
    if attention_dropout and not backend.supports_dropout:
        raise ValueError(_no_dropout(name, attention_dropout))


def _no_dropout(name: str, p: float) -> str:
    return (f"attention_backend '{name}' has no attention dropout, and model.attention_dropout is {p}; "
            "set model.attention_backend=auto (sdpa, or flash where installed) or sdpa, or model.attention_dropout=0")


def _fits(backend: AttentionBackend, dtype: torch.dtype, attention_dropout: float, training: bool) -> bool:
    return (backend.unavailable(training=training) is None
            and (backend.dtypes is None or dtype in backend.dtypes)
            and (backend.supports_dropout or not attention_dropout))


def resolve_backend(name: str, dtype: torch.dtype = torch.bfloat16, attention_dropout: float = 0.0) -> str:
    """The concrete backend for a configured name, compute dtype and attention dropout.

    `auto` is the first of `AUTO_PREFERENCE` that runs and trains here in `dtype` with
    `attention_dropout` (sdpa runs everywhere). A named backend is refused here, at model
    build, before any dataset is opened: ImportError when it does not run here (what to
    install), ValueError for a dtype it has not or dropout it cannot apply.
    """
    if name == "auto":
        for candidate in AUTO_PREFERENCE:
            backend = BACKENDS.get(candidate)
            if backend is not None and _fits(backend, dtype, attention_dropout, training=True):
                return candidate
        return "sdpa"
    backend = get_backend(name)
    if attention_dropout and not backend.supports_dropout:
        raise ValueError(_no_dropout(name, attention_dropout))
    reason = backend.unavailable(training=False)
    if reason is not None:
        raise ImportError(reason)
    if backend.dtypes is not None and dtype not in backend.dtypes:
        words = "/".join(_DTYPE_WORDS.get(d, str(d)) for d in backend.dtypes)
        raise ValueError(f"attention_backend {name!r} computes in {words} only, the model is {dtype}; "
                         f"train in bf16 or use attention_backend sdpa_split, flex or sdpa")
    return name
