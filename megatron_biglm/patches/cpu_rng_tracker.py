"""CPU shim: megatron's RNG tracker keeps real CPU generator states instead of CUDA ones.

Failure fixed: ``AssertionError: Torch not compiled with CUDA enabled`` from
``torch.cuda.get_rng_state()`` in ``CudaRNGStatesTracker.add``, reached from
``tensor_parallel.model_parallel_cuda_manual_seed``; and the same error from
``_get_cuda_rng_state`` / ``_set_cuda_rng_state`` in ``CudaRNGStatesTracker.fork`` (dropout
inside tensor-parallel regions) and in activation recompute (``CheckpointFunction``).
Seen in megatron-core 0.16.1.

Why not ``inference_rng_tracker=True`` (a no-op tracker): it silently makes tensor-parallel
dropout use the default stream, so TP ranks would draw correlated masks. This tracker keeps
megatron's semantics on CPU: each named state ("model-parallel-rng", ...) is a CPU generator
state seeded as megatron seeds it, and ``fork`` swaps it into torch's CPU generator.
The data-parallel ("default") stream on CPU is torch's CPU generator itself: seed it with
``torch.manual_seed(seed)`` before ``model_parallel_cuda_manual_seed(seed)``, as on GPU one
seeds both; megatron's ``torch.cuda.manual_seed`` call stays a (lazy) no-op here.
"""
from __future__ import annotations

import contextlib

import torch

from ._patching import Patch, import_or_none, log, replace_attr

NAME = "cpu_rng_tracker"
_RANDOM = "megatron.core.tensor_parallel.random"
_TRACKER_CLASSES: dict = {}


def cpu_tracker_class(base: type) -> type:
    """A subclass of megatron's CudaRNGStatesTracker (isinstance checks keep working)."""
    if base in _TRACKER_CLASSES:
        return _TRACKER_CLASSES[base]

    class CpuRNGStatesTracker(base):  # type: ignore[misc, valid-type]
        """CudaRNGStatesTracker whose states are CPU generator states."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"cpu rng state {name} already exists")
            generator = torch.Generator(device="cpu")
            generator.manual_seed(seed)
            self.states_[name] = generator.get_state()

        @contextlib.contextmanager
        def fork(self, name="model-parallel-rng"):
            if name not in self.states_:
                raise Exception(f"cpu rng state {name} is not added")
            outer_state = torch.get_rng_state()
            outer_name = self._current_state_name
            if outer_name != "default-rng":
                self.states_[outer_name] = outer_state
            torch.set_rng_state(self.states_[name])
            self._current_state_name = name
            try:
                yield
            finally:
                if self._current_state_name != name:
                    raise Exception(
                        f"current state name {self._current_state_name} is not the same as "
                        f"the desired state name {name}."
                    )
                self.states_[name] = torch.get_rng_state()
                if outer_name != "default-rng":
                    outer_state = self.states_[outer_name]
                torch.set_rng_state(outer_state)
                self._current_state_name = outer_name

    _TRACKER_CLASSES[base] = CpuRNGStatesTracker
    return CpuRNGStatesTracker


def _get_cpu_rng_state(device="cuda", clone: bool = False, graph_safe: bool = False):
    """Stand-in for random._get_cuda_rng_state: the CPU generator's state."""
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state, device: int = -1, graph_safe: bool = False) -> None:
    """Stand-in for random._set_cuda_rng_state."""
    torch.set_rng_state(new_state)


def apply() -> bool:
    random = import_or_none(_RANDOM)
    if random is None:
        return False
    base = getattr(random, "CudaRNGStatesTracker", None)
    if base is None or not hasattr(random, "initialize_rng_tracker"):
        log.info("%s: CudaRNGStatesTracker/initialize_rng_tracker missing: not needed", NAME)
        return False
    if base.__name__ != "CpuRNGStatesTracker":
        random.CudaRNGStatesTracker = cpu_tracker_class(base)
        existing = getattr(random, "_CUDA_RNG_STATE_TRACKER", None)
        if existing is not None and type(existing) is base:
            # Created before the patch: let the next initialize_rng_tracker build ours.
            random._CUDA_RNG_STATE_TRACKER_INITIALIZED = False
    replace_attr(random, "_get_cuda_rng_state", lambda _o: _get_cpu_rng_state, NAME)
    replace_attr(random, "_set_cuda_rng_state", lambda _o: _set_cpu_rng_state, NAME)
    return True


PATCH = Patch(NAME, "model_parallel_cuda_manual_seed -> torch.cuda.get_rng_state needs CUDA", apply)
