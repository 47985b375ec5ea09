"""The training backends behind one small interface, so run/train.py and loop.py stay backend-blind.

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

from pathlib import Path

from megatron_biglm.checkpoint import megatron_io
from megatron_biglm.checkpoint.dirs import CheckpointError, is_weights_only
from megatron_biglm.training import build, distributed, step
from megatron_biglm.training.backend_protocol import Backend, BuildSpec, load_initial_weights
from megatron_biglm.training.ddp_settings import ddp_config
from megatron_biglm.training.deepspeed_backend import deepspeed_backend
from megatron_biglm.training.schedule import resume_scheduler

__all__ = ["Backend", "BuildSpec", "check_resume", "load_initial_weights", "megatron_backend", "select_backend"]


def megatron_backend() -> Backend:
    def build_megatron(spec: BuildSpec, init_weights=None, provider=None):
        ddp = ddp_config(spec.training, spec.optimizer.use_distributed_optimizer)
        model_chunks, _ = build.build_model(spec.model, spec.precision, ddp, spec.training.recompute, provider,
                                            random_init=init_weights is None)
        if init_weights is not None:
            load_initial_weights(init_weights, [chunk.module for chunk in model_chunks], spec.reinit_mismatched_heads)
        return model_chunks, build.build_optimizer(spec.optimizer, model_chunks, spec.precision)

    def save_megatron(root, iteration, model_chunks, *args, **kwargs):
        # With overlap_param_gather the distributed optimizer's step leaves the all-gather of
        # the updated parameters to the next forward pass: gather them now, or the checkpoint
        # holds the other ranks' shards from the step before.
        for chunk in model_chunks:
            if chunk.ddp_config.overlap_param_gather:
                chunk.start_param_sync(force_sync=True)
        return megatron_io.save_checkpoint(root, iteration, model_chunks, *args, **kwargs)

    def load_megatron(path, model_chunks, optimizer, scheduler) -> dict:
        state = megatron_io.load_checkpoint(path, model_chunks, optimizer)
        resume_scheduler(scheduler, state["scheduler"]["num_steps"])
        return state

    return Backend("megatron", build_megatron, step.train_step, step.evaluate, save_megatron,
                   load_megatron, reshardable=True, shutdown=distributed.shutdown)


def select_backend(name: str) -> Backend:
    """The backend `training.backend` names; fails here (before any process group) if its
    package is missing."""
    if name == "deepspeed":
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
