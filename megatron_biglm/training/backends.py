"""The training backends behind one small interface, so train.py and loop.py stay backend-blind.

`megatron` (default): megatron DDP + megatron optimizer, schedules for TP/PP, and
dist_checkpointing checkpoints that reshard to any layout. `deepspeed`: a DeepSpeed ZeRO
engine around the same model, data parallel only (deepspeed_backend.py). Both write the same
checkpoint directory scheme and metadata, so resume, the model-compatibility refusal and
`latest` behave the same; a checkpoint is only resumed by the backend that wrote it.

A weights-only checkpoint (an HF import) is no resume point: either backend starts from it
at any layout, `build(..., init_weights=path)` loading its weights into the bare model
before the optimizer (megatron's master copies) or ZeRO engine (DeepSpeed's fp32 master
copy and partitions) is created from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from megatron_biglm.training.checkpoint_dir import CheckpointError, is_weights_only
from megatron_biglm.training.config import RunConfig


@dataclass(frozen=True)
class Backend:
    name: str
    build: Callable       # (config, model_config, precision, num_microbatches, init_weights=None, provider=None)
    #                       -> (model_chunks, optimizer); init_weights: a checkpoint to take the weights from;
    #                       provider: the recipe's model_provider (None: BiGLMModel)
    train_step: Callable  # signature of step.train_step
    evaluate: Callable    # signature of step.evaluate
    save: Callable        # signature of checkpoint.save_checkpoint
    load: Callable        # signature of checkpoint.load_checkpoint
    reshardable: bool     # can its checkpoints resume at another data-parallel size?
    shutdown: Callable    # (DistInfo) -> None: tear down process groups (distributed.shutdown's signature)


def megatron_backend() -> Backend:
    from megatron_biglm.training import build, checkpoint, distributed, step

    def build_megatron(config, mc, precision, num_microbatches, init_weights=None, provider=None):  # noqa: ARG001
        model_chunks, _ = build.build_model(config, mc, precision, provider)
        if init_weights is not None:
            load_initial_weights(init_weights, [chunk.module for chunk in model_chunks])
        return model_chunks, build.build_optimizer(config, model_chunks, precision)

    return Backend("megatron", build_megatron, step.train_step, step.evaluate, checkpoint.save_checkpoint,
                   checkpoint.load_checkpoint, reshardable=True, shutdown=distributed.shutdown)


def load_initial_weights(path: Path, modules) -> None:
    """Collective: copy a checkpoint's model weights into each bare model chunk (any saved
    TP/PP: dist_checkpointing reshards); refuses a checkpoint of another shape."""
    from megatron_biglm.export.weights_only import load_model_weights

    for module in modules:
        load_model_weights(path, module)


def select_backend(config: RunConfig) -> Backend:
    """The configured backend; fails here (before any process group) if its package is missing."""
    if config.training.backend == "deepspeed":
        from megatron_biglm.training.deepspeed_backend import deepspeed_backend
        return deepspeed_backend()
    return megatron_backend()


def check_resume(saved_state: dict, backend: Backend, path: Path, data_parallel_size: int) -> None:
    """Refuse a checkpoint another backend wrote, or a DP change the backend cannot reshard.
    A weights-only checkpoint passes: it is loaded into the bare model, whatever wrote it."""
    if is_weights_only(saved_state):
        return
    saved = saved_state.get("backend", "megatron")  # checkpoints from before the field: megatron
    if saved != backend.name:
        raise CheckpointError(
            f"checkpoint {path} was written by the {saved} backend, but this run uses training.backend="
            f"{backend.name}; set training.backend={saved} to resume it, or checkpoint.load=none to start fresh")
    if not backend.reshardable and saved_state.get("dp") != data_parallel_size:
        raise CheckpointError(
            f"checkpoint {path} was written with data-parallel size {saved_state.get('dp')}, this run has "
            f"{data_parallel_size}: {backend.name} checkpoints resume only at the same size. Launch "
            f"{saved_state.get('dp')} processes, or start fresh with checkpoint.load=none")
