"""What a training backend is (`Backend`) and what every backend shares to start from weights.

Why its own module: backends.py picks a backend and so imports each implementation; the
implementations (deepspeed_backend.py) need the interface and the weight loading, not the
registry. Keeping those here leaves no import circle between the registry and a backend.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from megatron_biglm.checkpoint.weights_only import load_model_weights
from megatron_biglm.config import OptimizerConfig, TrainingConfig


@dataclass(frozen=True)
class BuildSpec:
    """What a backend reads to build a run's model and optimizer: the model config, the
    resolved precision, the micro-batches per step, the run config's `training:` and
    `optimizer:` sections, and whether a start checkpoint's head of another shape starts
    fresh (`finetune.reinit_mismatched_heads`)."""
    model: object                 # megatron_biglm.model.BiGLMModelConfig
    precision: str                # "fp32" or "bf16" (build.resolve_precision)
    num_microbatches: int
    training: TrainingConfig
    optimizer: OptimizerConfig
    reinit_mismatched_heads: bool = False


@dataclass(frozen=True)
class Backend:
    name: str
    build: Callable       # (BuildSpec, init_weights=None, provider=None) -> (model_chunks, optimizer);
    #                       init_weights: a checkpoint to take the weights from;
    #                       provider: the recipe's model_provider (None: BiGLMModel)
    train_step: Callable  # signature of step.train_step
    evaluate: Callable    # signature of step.evaluate
    save: Callable        # signature of checkpoint.megatron_io.save_checkpoint (the run's texts: files.RunFiles)
    load: Callable        # (path, model_chunks, optimizer, scheduler) -> saved train state
    reshardable: bool     # can its checkpoints resume at another data-parallel size?
    shutdown: Callable    # (DistInfo) -> None: tear down process groups (distributed.shutdown's signature)


def load_initial_weights(path: Path, modules, reinit_mismatched_heads: bool) -> None:
    """Collective: copy a checkpoint's model weights into each bare model chunk (any saved
    TP/PP: dist_checkpointing reshards); refuses a checkpoint of another shape, and a head of
    another shape unless `reinit_mismatched_heads` (`finetune.reinit_mismatched_heads`) starts
    it fresh. run/train.py has verified the checkpoint (checkpoint.verify) before anything was built."""
    for module in modules:
        load_model_weights(path, module, verify=False, fresh_heads=True,  # a fine-tune's new heads
                           reinit_mismatched=reinit_mismatched_heads)
