"""Regional compilation of the transformer layers (`model.compile_layers`), compiled once.

Each layer's forward goes through `torch.compile` as one graph (`fullgraph=True`: a graph break
is an error, not a silent fall-back to eager pieces), and every layer reuses the same compiled
code: the layers differ only in their weights, which dynamo reads as inputs. What keeps it from
recompiling per call:

- nothing in the layer looks anything up per layer or per call: the attention mask (and its
  SDPA form) is built before the layers run, and a cached forward's keys/values go through a
  port per layer resolved beforehand (`kv_cache.LayerKV`);
- the sequence and batch sizes of the layers' inputs are marked dynamic (`mark_dynamic_inputs`),
  so a fresh batch shape or split reuses the graph instead of compiling a new one (sizes 0
  and 1 still get a graph of their own, as dynamo specialises them);
- ints read off a module (a port's key count) are not specialised, so they become dynamic
  like the sizes; dynamo's settings for this are made in every thread that runs the layers
  (`apply_compile_settings`: torch keeps them per thread, and a server decodes in a worker);
- the hidden states come with standard strides (`standard_strides`), the sizes of a cached
  forward's ports are marked dynamic too (`mark_dynamic_ports`); sizes 0 and 1 (a one-row
  batch, a one-key cache) still get graphs of their own, as dynamo specialises them;
- the per-function recompile limit is raised to `RECOMPILE_LIMIT`: every layer shares one
  code object, and the variants a model legitimately has must never reach it, or (with
  `fullgraph=True`) the next forward fails. They are bounded: at most 7 paths (training, a
  fresh prefix, recording a prefix, reading one, the pool's in-place, gathered and broadcast
  reads) times a mask or none, times a batch of 1 or more, times one row or more: 56.

The megatron-core call that used to break the graph is patched by name
(`patches/row_linear_tp_group.py`); SwiGLU's backward has a compile-friendly form (`mlp.py`).
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch._dynamo
from torch._dynamo import maybe_mark_dynamic

from megatron_biglm.common.compile_counts import watch_compiles

#: dynamo's recompile limit per function while layers are compiled (its default is 8).
RECOMPILE_LIMIT = 64


def compile_layers_on(setting: "bool | str") -> bool:
    """Whether `model.compile_layers` compiles the transformer layers here: `auto` where CUDA
    is available, `True`/`False` as given."""
    return torch.cuda.is_available() if setting == "auto" else bool(setting)


def compile_layers(layers: Iterable[torch.nn.Module]) -> None:
    """Compile each layer in place (same module, parameters and state dict keys), one graph each."""
    watch_compiles()
    apply_compile_settings()
    for layer in layers:
        layer.compile(fullgraph=True)


def apply_compile_settings() -> None:
    """Dynamo's settings for the compiled layers, in the calling thread; called before every
    forward through them. torch keeps a user's config settings per thread (a context
    variable), so a model compiled in one thread and run in another (the server's worker
    thread) must set them there too.

    - A cached forward's port sits on each layer's core attention; its host int (the key count)
      changes per call. Dynamo specialises ints read off a module unless told
      otherwise, which would compile once per key count.
    - The recompile limit is raised to `RECOMPILE_LIMIT`."""
    config = torch._dynamo.config
    if not config.allow_unspec_int_on_nn_module:
        config.allow_unspec_int_on_nn_module = True
    if config.recompile_limit < RECOMPILE_LIMIT:
        config.recompile_limit = RECOMPILE_LIMIT


def standard_strides(hidden: torch.Tensor) -> torch.Tensor:
    """`hidden` with the strides of a fresh contiguous tensor. A `[s, 1, h]` transposed from
    `[1, s, h]` counts as contiguous but keeps stride `s * h` on its batch dim, and dynamo
    guards on strides: a one-row batch would compile again."""
    expected, stride = [], 1
    for size in reversed(hidden.shape):
        expected.insert(0, stride)
        stride *= size
    if list(hidden.stride()) == expected:
        return hidden
    return hidden.clone(memory_format=torch.contiguous_format)


def mark_dynamic_inputs(hidden: Optional[torch.Tensor], rotary: Optional[torch.Tensor], params) -> None:
    """Mark the sizes that change between calls as dynamic on the compiled layers' inputs:
    hidden states `[s, b, h]` (s, b), RoPE angles `[s, b or 1, 1, d]` (s, b), and a dense
    mask `[b, 1, q, k]` (b, q, k) where the backend derived one (sdpa, local)."""
    if hidden is not None:
        maybe_mark_dynamic(hidden, 0)
        maybe_mark_dynamic(hidden, 1)
    if isinstance(rotary, torch.Tensor):
        maybe_mark_dynamic(rotary, 0)
        if rotary.shape[1] > 1:
            maybe_mark_dynamic(rotary, 1)
    derived = None if params is None else params.derived
    if isinstance(derived, torch.Tensor) and derived.dim() == 4:
        for dim in (0, 2, 3):
            maybe_mark_dynamic(derived, dim)


def mark_dynamic_ports(ports) -> None:
    """Mark the per-call sizes of a cached forward's ports as dynamic: every tensor a port or its
    plan holds (cached keys `[w, b, ng, d]`, write positions `[q, b]`, slot indices `[b]`) on its
    first two dims, except the pool's own buffers (`keys`, `values`: fixed until the pool grows)."""
    for port in ports:
        held = [v for k, v in vars(port).items() if k not in ("keys", "values")]
        plan = getattr(port, "plan", None)
        held += list(vars(plan).values()) if plan is not None else []
        for value in held:
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor):
                    for dim in range(min(2, t.dim())):
                        maybe_mark_dynamic(t, dim)
