"""Attention backends: one file each, one `AttentionBackend` object each (`protocol.py`),
registered in `registry.py`; `full.py` is the kernel of full attention, whatever the backend."""
from .protocol import HALF_DTYPES, AttentionBackend, DeriveOptions
from .registry import (AUTO_PREFERENCE, BACKENDS, backend_names, check_backend_name, get_backend, register_backend,
                       resolve_backend)

__all__ = ["AUTO_PREFERENCE", "AttentionBackend", "BACKENDS", "DeriveOptions", "HALF_DTYPES", "backend_names",
           "check_backend_name", "get_backend", "register_backend", "resolve_backend"]
