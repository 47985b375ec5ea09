"""The DeepSpeed backend: a ZeRO-1/2/3 engine around the same BiGLM model, data parallel only.

For users who prefer DeepSpeed's ZeRO (and its CPU offload) over megatron's distributed
optimizer. It plugs into the same loop as the megatron backend (see backends.py and backend_protocol.py); what
differs is only how a step, an evaluation and a checkpoint are done:

- Step: the loss is the same per-token mean over the whole global batch as the megatron
  backend's. The step's micro-batches are read first and their predicted tokens counted
  over all ranks, so each micro-batch's backward can carry `loss_sum · DP / global_count`
  (DeepSpeed averages gradients over DP ranks; `scale_wrt_gas=False` stops it dividing by
  the accumulation steps again). The update then equals megatron's: same AdamW, same
  weight-decay groups, same clipping, same lr schedule (our scheduler drives the lr).
- Non-finite loss: the NaN guard decides before the last backward. A rejected step is fed
  a NaN loss so DeepSpeed's own overflow path skips the update and clears the partitioned
  gradients (ZeRO skips every step whose gradient norm is not finite); nothing here reaches
  into ZeRO's buffers.
- Checkpoints: DeepSpeed's own, inside our atomic checkpoint scheme (deepspeed_checkpoint.py).
- fp32 has no loss scaling (DeepSpeed's fp16 section stays off); on GPU `bf16` runs
  DeepSpeed's bf16 ZeRO with fp32 master weights.
"""
from __future__ import annotations

import logging
import math
import os

import torch
import torch.distributed as dist

from megatron_biglm.config import ConfigError, OptimizerConfig, TrainingConfig
from megatron_biglm.training import distributed
from megatron_biglm.training.backend_protocol import Backend, BuildSpec, load_initial_weights
from megatron_biglm.training.build import build_module
from megatron_biglm.training.deepspeed_checkpoint import load_checkpoint, save_checkpoint
from megatron_biglm.training.recipe import add_report, report_width, split_report
from megatron_biglm.training.step import StepResult, StepStats, make_forward_step

INSTALL_HINT = ("pip install 'megatron-biglm[deepspeed]' (CPU machines: DS_BUILD_OPS=0 pip install "
                "-c constraints-cpu.txt 'megatron-biglm[deepspeed]')")


def import_deepspeed():
    """`deepspeed`, set up for this machine; ConfigError with the install command if absent."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read at import: never probe for CUDA
    try:
        import deepspeed  # lazy: optional (deepspeed extra)
    except ImportError as exc:
        raise ConfigError(f"training.backend=deepspeed needs the deepspeed package ({exc}); "
                          f"{INSTALL_HINT}, or use training.backend=megatron") from None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # its INFO lines would drown our log
    return deepspeed


def deepspeed_backend() -> Backend:
    import_deepspeed()
    return Backend("deepspeed", build_engine, train_step, evaluate, save_checkpoint, load_checkpoint,
                   reshardable=False, shutdown=shutdown)


def shutdown(info) -> None:
    """Destroy the process group through deepspeed when this run created it: deepspeed caches
    groups cloned from the world, and only its own teardown drops them, so a later run in the
    same process (tests, notebooks) does not meet a dead group."""
    import deepspeed.comm  # lazy: optional (deepspeed extra)
    if info.created_group and deepspeed.comm.is_initialized():
        deepspeed.comm.destroy_process_group()
    distributed.shutdown(info)


def deepspeed_config(t: TrainingConfig, optimizer: OptimizerConfig, precision: str, num_microbatches: int) -> dict:
    """The DeepSpeed JSON config: batch from the `training:` section, clipping from `optimizer:`,
    the resolved precision, ZeRO from `training.deepspeed`, then `training.deepspeed.extra`
    merged in (validated in config/run_config.py)."""
    ds = t.deepspeed
    zero = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu"}
    out = {
        "train_batch_size": t.global_batch_size,
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": num_microbatches,
        "gradient_clipping": optimizer.clip_grad,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16", "check_grad_overflow": True},
        "fp16": {"enabled": False},
        "zero_allow_untested_optimizer": True,  # torch AdamW: the same optimizer as the megatron backend
        "zero_force_ds_cpu_optimizer": False,   # ... also under offload (no cpu_adam build)
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    for key, value in ds.extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


def weight_decay_groups(module) -> list[dict]:
    """megatron's default groups: no weight decay on biases and 1-D parameters (norms)."""
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            (no_decay if param.dim() == 1 or name.endswith(".bias") else decay).append(param)
    return [g for g in ({"params": decay, "wd_mult": 1.0}, {"params": no_decay, "wd_mult": 0.0}) if g["params"]]


def build_engine(spec: BuildSpec, init_weights=None, provider=None):
    """([engine], engine.optimizer): the model from the shared builder wrapped by deepspeed.
    `init_weights` (a checkpoint) is loaded into the bare module first: deepspeed.initialize
    takes ZeRO's fp32 master copy (and, at stage 3, the partitions) from the module."""
    deepspeed = import_deepspeed()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        os.environ.setdefault("LOCAL_RANK", "0")  # deepspeed insists; a plain `python` run has no launcher
    module, _ = build_module(spec.model, spec.precision, spec.training.recompute, provider,
                             random_init=init_weights is None)
    if init_weights is not None:
        load_initial_weights(init_weights, [module], spec.reinit_mismatched_heads)
    o = spec.optimizer
    optimizer = torch.optim.AdamW(weight_decay_groups(module), lr=o.lr, betas=(o.adam_beta1, o.adam_beta2),
                                  eps=o.adam_eps, weight_decay=o.weight_decay)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer,
                                      config=deepspeed_config(spec.training, o, spec.precision,
                                                              spec.num_microbatches))
    return [engine], engine.optimizer


def _all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor)
    return tensor


def train_step(model_chunks, optimizer, scheduler, guard, data_iterator, *,  # noqa: ARG001 - shared signature
               num_microbatches, seq_length, micro_batch_size, device, recipe, iteration):
    """One optimizer step over the global batch (same contract as step.train_step)."""
    engine = model_chunks[0]
    stats = StepStats()
    forward_step = make_forward_step(device, recipe, stats)
    batches = [next(data_iterator) for _ in range(num_microbatches)]
    local = sum(recipe.loss_tokens(b) for b in batches)
    global_count = int(_all_reduce(torch.tensor([float(local)], dtype=torch.float64, device=device)).item())
    grad_scale = engine.dp_world_size / max(global_count, 1)
    scheduler.step(1)  # lr of this step = lr(iteration), as in the megatron backend
    report = torch.zeros(report_width(recipe), dtype=torch.float64, device=device)
    apply = True
    for i, batch in enumerate(batches):
        output, loss_func = forward_step(iter([batch]), engine)
        loss_sum, _, parts = loss_func(output)
        add_report(report, parts, recipe)
        if i == num_microbatches - 1:
            reduced = _all_reduce(report.clone())
            loss = split_report(reduced, recipe)[0]
            apply = guard.check(loss, iteration)  # raises after too many in a row
            if not apply:
                loss_sum = loss_sum * math.nan  # DeepSpeed's overflow check skips the update
        engine.backward(loss_sum * grad_scale, scale_wrt_gas=False)
        engine.step()
    applied = engine.was_step_applied()
    if applied and not apply:
        raise RuntimeError("DeepSpeed applied an update that the non-finite guard rejected; this DeepSpeed "
                           "version does not skip steps with non-finite gradients")
    norm = engine.get_global_grad_norm() if applied else None
    return StepResult(reduced, norm, stats)


@torch.no_grad()
def evaluate(model_chunks, data_iterator, *, iters, num_microbatches, seq_length,  # noqa: ARG001
             micro_batch_size, device, recipe) -> dict:
    """Per-token validation loss and the recipe's metrics over `iters` global batches
    (same contract as step.evaluate)."""
    engine = model_chunks[0]
    forward_step = make_forward_step(device, recipe)
    total = torch.zeros(report_width(recipe), dtype=torch.float64, device=device)
    engine.eval()
    try:
        for _ in range(iters * num_microbatches):
            output, loss_func = forward_step(data_iterator, engine)
            add_report(total, loss_func(output)[2], recipe)
    finally:
        engine.train()
    _all_reduce(total)
    loss, _, metrics = split_report(total, recipe)
    return {"loss": loss, **metrics}
