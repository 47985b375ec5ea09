"""Counting what torch.compile does while real code runs: the compile counts at chosen
points, and the difference after a warm-up (shared by the `recompile` tests of each package)."""
from __future__ import annotations

import pytest

from megatron_biglm.common.compile_counts import CompileCounts, compile_counts


class CountsPerStep:
    """A training step callback recording the compile counts after each step."""

    def __init__(self):
        self.after: dict[int, CompileCounts] = {}

    def on_step(self, step, loop_state, ctx):  # noqa: ARG002 - the step callback's signature
        self.after[step] = compile_counts()


def describe(counts: CompileCounts) -> str:
    """The counts for an assertion message: totals and each break's first line."""
    reasons = "; ".join(f"{n}x {r.splitlines()[0] if r else ''}" for r, n in counts.graph_breaks)
    return f"{counts.compiles} compiles, {counts.recompiles} recompiles, {counts.breaks} breaks ({reasons})"


def compiled_megatron_adapter(checkpoint, *, cache_layout: str = "grow"):
    """(adapter, tokenizer): `checkpoint`'s weights in a model built with
    `model.compile_layers=True` (a checkpoint trained with that setting loads so; CPU runs
    default to eager), behind the megatron adapter and prefix cache `load_adapter` gives it."""
    import dataclasses

    from megatron_biglm.inference.loading import load_megatron_checkpoint
    from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter
    from megatron_biglm.inference.protocol import inference_token_ids
    from megatron_biglm.model import model_provider

    loaded = load_megatron_checkpoint(checkpoint)
    cfg = dataclasses.replace(loaded.checkpoint.model_config, compile_layers=True)
    model = model_provider(True, True, config=cfg, params_dtype=next(loaded.model.parameters()).dtype)
    model.load_state_dict(loaded.model.state_dict())
    adapter = MegatronMaskedLMAdapter(model.eval(), inference_token_ids(loaded.tokenizer), vocab_size=cfg.vocab_size,
                                      max_length=int(cfg.seq_length), cache_layout=cache_layout)
    return adapter, loaded.tokenizer


def compiled_megatron_generator(checkpoint, *, cache_layout: str = "pool"):
    """A `MaskPredictGenerator` over `compiled_megatron_adapter`."""
    from megatron_biglm.generation import MaskPredictGenerator

    return MaskPredictGenerator(*compiled_megatron_adapter(checkpoint, cache_layout=cache_layout))


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before and after the test: every model in a process shares the
    transformer layer's code object, so other tests' models would count toward its recompile
    limit (a run holds one model)."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
