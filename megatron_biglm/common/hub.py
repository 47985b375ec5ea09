"""The one rule for a command that reads from the Hugging Face hub on a machine without it:
stop with one line that says what could not be reached and what local input to pass instead
(a `--data-dir`, a file per split, a local model directory), never a traceback from deep in
`datasets` or `huggingface_hub`.

`hub_access(what, instead)` wraps the call that may go to the hub; a failure that is the hub
being unreachable (offline mode, no network, a cache miss in offline mode) becomes
`HubUnavailable`, which every command prints as `error: ...`. Other errors pass unchanged.
"""
from __future__ import annotations

from contextlib import contextmanager

#: exception class names the hub stack (datasets, huggingface_hub, requests, httpx, urllib3)
#: raises when the hub cannot be reached; matched by name so that none of them is imported here
_UNREACHABLE_TYPES = frozenset({
    "ConnectionError", "ConnectError", "ConnectTimeout", "ReadTimeout", "Timeout", "MaxRetryError",
    "NewConnectionError", "NameResolutionError", "OfflineModeIsEnabled", "LocalEntryNotFoundError",
})
#: what the same stack says in a plain OSError/ValueError when it could not reach the hub
_UNREACHABLE_WORDS = ("couldn't connect", "could not connect", "couldn't reach", "offline mode",
                      "hf_hub_offline", "hf_datasets_offline", "connection error")


class HubUnavailable(RuntimeError):
    """The hub could not be reached; the message names the local input to pass instead."""


def is_hub_unreachable(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, says the hub could not be reached."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any(cls.__name__ in _UNREACHABLE_TYPES for cls in type(exc).__mro__):
            return True
        if isinstance(exc, (OSError, ValueError, RuntimeError)) and any(
                word in str(exc).lower() for word in _UNREACHABLE_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@contextmanager
def hub_access(what: str, instead: str):
    """Run the body; if it fails because the hub is unreachable, raise `HubUnavailable`:
    "could not reach the Hugging Face hub for WHAT (cause); offline, pass INSTEAD"."""
    try:
        yield
    except HubUnavailable:
        raise
    except Exception as exc:  # the hub stack raises many types when offline; others re-raised
        if not is_hub_unreachable(exc):
            raise
        cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise HubUnavailable(f"could not reach the Hugging Face hub for {what} ({type(exc).__name__}: {cause}); "
                             f"offline, pass {instead}") from None
