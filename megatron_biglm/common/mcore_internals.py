"""The private megatron-core members this project relies on, and the per-release differences
of its public ones, each in one place.

megatron-core's public API covers almost everything BiGLM needs. Where it does not, the
private member is wrapped here, its behaviour per supported release is checked, and anything
else fails with a message that names the member and the releases this project was tested on
(rather than an unpacking error deep in a data-loader worker). ``tests/common/test_mcore_internals.py``
pins each wrapper against megatron-core's public behaviour.

Supported: megatron-core 0.16.1 (what Python 3.11 resolves) through 0.19.x (Python >= 3.12).
"""
from __future__ import annotations

import functools
import queue
from dataclasses import fields
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
    from megatron.core.transformer.transformer_config import TransformerConfig  # lazy: start-up (megatron.core: 2.9 CPU s)

    names = {f.name for f in fields(TransformerConfig)}
    for name in ("cuda_graph_modules", "cuda_graph_scope"):
        if name in names:
            return {name: []}
    return {}


def mlp_submodule(module, submodules, params: dict):
    """A transformer layer's `mlp` entry for `module`, an `MLP` subclass, as each release builds it.

    0.19 hands the layer's MLP `pg_collection` and expects `module.as_mlp_submodule` (it rewraps
    a `ModuleSpec` itself only for `MLP` and TE's fused MLP, warning on every layer; any other
    module gets `pg_collection` it does not take). 0.16 has no `as_mlp_submodule` and builds a
    `ModuleSpec` (passing `tp_group` only to `MLP` itself; a subclass resolves the same group).
    """
    from megatron.core.transformer.spec_utils import ModuleSpec  # lazy: start-up (megatron.core: 2.9 CPU s)

    if hasattr(module, "as_mlp_submodule"):
        return functools.partial(module.as_mlp_submodule, submodules=submodules, **params)
    return ModuleSpec(module=module, params=params, submodules=submodules)


def in_process_save_strategy():
    """A `dist_checkpointing.save` strategy for the torch_dist format that writes this rank's
    shards from this process, into one file, with no helper process.

    megatron's default torch_dist saver (`TorchDistSaveShardedStrategy`) hands its write plan to
    `FileSystemWriterAsync.write_preloaded_data_multiproc`, which forks one writer process per
    file (two by default) on every save, and returns the results through a queue served by a
    `multiprocessing` Manager that it spawns on the first save. That machinery serves
    megatron's asynchronous checkpointing (the write runs in another process); a synchronous
    save, which is the only kind this project makes, pays a fork per file and a round trip to
    the Manager per save for nothing, and a spawned Manager re-imports the ``__main__`` of a
    driver script without an ``if __name__ == "__main__":`` guard. Here the same plan, the same
    per-file writer (`FileSystemWriterAsync.write_preloaded_data`, fsync included) and the same
    finalisation (metadata) run in this process, and the results queue is an in-process queue.
    The files are megatron's torch_dist format: any reader, and `dist_checkpointing.load`,
    reads them as before.

    Relies on two private members, checked here: the writer's per-save function is
    ``partial(write_preloaded_data_multiproc, transform_list, use_msc)`` called with
    ``(rank, write_buckets, results_queue)`` (0.16; 0.19's writer runs threads in this process,
    ``write_preloaded_data_multithread``, and is kept as it is), and `filesystem_async` keeps its
    results queue in the module global ``_results_queue``, created on first use."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async  # lazy: start-up (megatron.core: 2.9 CPU s)
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy  # lazy: start-up (megatron.core: 2.9 CPU s)

    writer = filesystem_async.FileSystemWriterAsync
    if not hasattr(filesystem_async, "_results_queue") or not callable(getattr(writer, "write_preloaded_data", None)):
        raise _unsupported("dist_checkpointing.strategies.filesystem_async", "no _results_queue or write_preloaded_data")
    if filesystem_async._results_queue is None:  # no Manager: the queue is read in this process
        filesystem_async._results_queue = queue.Queue()

    class InProcessTorchDistSave(TorchDistSaveShardedStrategy):
        def async_save(self, sharded_state_dict, checkpoint_dir, **release_kwargs):
            # 0.19's synchronous save asks for async_strategy="mcore" (megatron's own writer,
            # the one checked below); 0.16 has no such argument
            request = super().async_save(sharded_state_dict, checkpoint_dir, **release_kwargs)
            if request.async_fn is None:  # nothing to write on this rank
                return request
            fn = request.async_fn
            if isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") == \
                    "write_preloaded_data_multithread":
                return request  # 0.19: megatron's writer already writes from this process (threads)
            if not (isinstance(fn, functools.partial) and getattr(fn.func, "__name__", "") ==
                    "write_preloaded_data_multiproc" and len(fn.args) == 2 and len(request.async_fn_args) == 3):
                raise _unsupported("FileSystemWriterAsync.get_save_function_and_args", repr(fn))
            return request._replace(async_fn=functools.partial(_write_here, writer, *fn.args))

    return InProcessTorchDistSave("torch_dist", 1, thread_count=1)


def _write_here(writer, transform_list, use_msc, rank, write_buckets, results_queue) -> None:  # noqa: ARG001
    """`write_preloaded_data_multiproc`'s contract without its processes: write each bucket in
    turn and put ``{bucket index: write results}`` (or the first error) on `results_queue`."""
    results: dict = {}
    for index, bucket in enumerate(write_buckets):
        local, count = queue.Queue(), queue.Queue()
        count.put(index)
        writer.write_preloaded_data(transform_list, index, bucket, local, count, use_fsync=True,
                                    **({"use_msc": True} if use_msc else {}))
        _, written = local.get_nowait()
        if isinstance(written, Exception):
            results_queue.put(written)
            return
        results[index] = written
    results_queue.put(results)


def grads_for_grad_norm(optimizer) -> list:
    """The gradients one megatron optimizer (not a chained one) counts in its gradient norm:
    no shared or tensor-parallel duplicate parameter twice.

    megatron-core renamed the method: ``get_main_grads_for_grad_norm()`` up to 0.16,
    ``get_grads_for_grad_norm()`` from 0.19 on (whose default, no separate grad-norm group
    registered, is the same set)."""
    for name in ("get_grads_for_grad_norm", "get_main_grads_for_grad_norm"):
        method = getattr(optimizer, name, None)
        if method is not None:
            return method()
    raise _unsupported("MegatronOptimizer.get_grads_for_grad_norm",
                       f"no such method on {type(optimizer).__name__}")
