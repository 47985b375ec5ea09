"""The private megatron-core members this project relies on, and the per-release differences
of its public ones, each in one place.

megatron-core's public API covers almost everything BiGLM needs. Where it does not, the
private member is wrapped here, its behaviour per supported release is checked, and anything
else fails with a message that names the member and the releases this project was tested on
(rather than an unpacking error deep in a data-loader worker). ``tests/test_mcore_internals.py``
pins each wrapper against megatron-core's public behaviour.

Supported: megatron-core 0.16.1 (what Python 3.11 resolves) through 0.19.x (Python >= 3.12).
"""
from __future__ import annotations

from importlib.metadata import version

import numpy as np

#: The megatron-core releases the test suite runs on (CI: one per supported Python stack).
TESTED_RELEASES = ("0.16.1", "0.19.2")


def mcore_version() -> tuple[int, ...]:
    """The installed megatron-core release as a tuple of ints, e.g. (0, 19, 2)."""
    parts = []
    for piece in version("megatron-core").split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class UnsupportedMegatronCore(RuntimeError):
    """A private megatron-core member changed shape in a release this project does not know."""


def _unsupported(member: str, got: str) -> UnsupportedMegatronCore:
    found = ".".join(map(str, mcore_version()))
    return UnsupportedMegatronCore(
        f"megatron-core {found}: {member} returned {got}, which this version of megatron-biglm "
        f"does not know (tested on {', '.join(TESTED_RELEASES)}). Install a tested release, e.g. "
        f"pip install 'megatron-core=={TESTED_RELEASES[-1]}', or report the change.")


def gpt_sample_tokens(dataset, idx: int) -> np.ndarray:
    """The raw token window of sample ``idx`` of a megatron ``GPTDataset`` (no shifting, no
    padding replacement): megatron's document/sample/shuffle index lookup.

    Wraps the private ``GPTDataset._query_document_sample_shuffle_indices``, which returns
    ``(tokens, document_ids)`` up to 0.16 and ``(tokens, document_ids, document_lengths)``
    from 0.19 on (the lengths feed its inter-document masking). The public ``__getitem__``
    would return the same tokens but also builds labels, loss and position tensors, and
    rewrites pad-id tokens, none of which a masked LM wants.
    """
    member = "GPTDataset._query_document_sample_shuffle_indices"
    result = dataset._query_document_sample_shuffle_indices(idx)
    if not isinstance(result, tuple) or len(result) not in (2, 3):
        raise _unsupported(member, f"a {type(result).__name__} of length {len(result)}"
                           if isinstance(result, tuple) else f"a {type(result).__name__}")
    tokens = result[0]
    if not isinstance(tokens, np.ndarray) or tokens.ndim != 1:
        raise _unsupported(member, f"tokens of type {type(tokens).__name__}")
    return tokens


def transformer_config_release_defaults() -> dict:
    """TransformerConfig arguments whose right value differs between supported releases.

    The CUDA-graph scope defaults to "full", which warns as deprecated on every config; the
    empty list is its stated equivalent (the whole layer). 0.16 names the field
    ``cuda_graph_scope``, 0.19 ``cuda_graph_modules``. BiGLM captures no CUDA graphs either way.
    """
    from dataclasses import fields

    from megatron.core.transformer.transformer_config import TransformerConfig

    names = {f.name for f in fields(TransformerConfig)}
    for name in ("cuda_graph_modules", "cuda_graph_scope"):
        if name in names:
            return {name: []}
    return {}


def start_checkpoint_writer_queue() -> None:
    """Start megatron's checkpoint-writer results queue now, so that a driver script without an
    ``if __name__ == "__main__":`` guard can save.

    `dist_checkpointing.save` (torch_dist format) hands its results through one queue served by
    a `multiprocessing` Manager started with "spawn" (`strategies.filesystem_async`: private
    `_get_write_results_queue` in 0.16, public `get_write_results_queue` from 0.19; created on
    the first save). A spawned
    child re-imports the parent's ``__main__`` script, so a script without the guard runs again
    inside it and the save fails with multiprocessing's bootstrapping error. The Manager's
    server runs none of the caller's code, so it is started here with ``__main__``'s file and
    spec hidden: the child then imports nothing of the script. Later saves reuse the queue.

    The server starts with the stop signals blocked (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2),
    a mask it inherits and keeps. SLURM signals every process of a job step (scancel's SIGTERM,
    the `--signal` warning before the time limit, preemption), this server too: dying of the
    signal, it would fail the very save the signal asks the trainer for (EOFError on the queue).
    In the calling thread they are blocked only while the server (and multiprocessing's resource
    tracker) start, then arrive (pending signals are delivered at the unblock); the server ends
    with the process that started it (its finalizer), and SIGKILL still ends it."""
    import signal
    import sys
    from multiprocessing import resource_tracker

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    start = getattr(filesystem_async, "get_write_results_queue", None) or \
        getattr(filesystem_async, "_get_write_results_queue", None)
    if not callable(start):
        raise _unsupported("dist_checkpointing.strategies.filesystem_async.get_write_results_queue",
                           "nothing (the member is gone)")
    main = sys.modules.get("__main__")
    saved = dict(vars(main)) if main is not None else {}
    blocked = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    try:
        # multiprocessing's resource tracker, which the spawn starts first, unblocks SIGINT and
        # SIGTERM in this thread after starting it: start it now, then block again
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
        if main is not None:  # what an interactive session looks like to multiprocessing.spawn
            main.__spec__ = None
            vars(main).pop("__file__", None)
        start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if main is not None:
            for key in ("__spec__", "__file__"):
                if key in saved:
                    setattr(main, key, saved[key])
