"""The run driver: `train(cfg, recipe=..., callbacks=...)` runs (or resumes) one
training run of a loaded `RunConfig` through its named phases (prepare, choose the start,
build, announce, loop, finish), holding the run directory's lock (`run_lock.py`) for its life. Pretraining (`cli/train.py`) and every fine-tune
(`run/finetune.py`) are this function with another recipe; the config is loaded once, by
whoever calls it, and what ran is saved as the run's config.yaml.

Where a run starts (`checkpoint.load`): `auto` resumes this run's latest checkpoint, `none`
starts fresh, a path resumes that checkpoint. A path to a weights-only checkpoint (an HF
import, `python -m megatron_biglm.cli.convert from-hf`) starts from its weights with a fresh
optimizer and schedule at step 0, until this run saves its own checkpoints: from then on
the same command resumes those (checkpoint/dirs.py choose_start).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from megatron_biglm.checkpoint import dirs as checkpoint_dir
from megatron_biglm.checkpoint.dirs import StartPoint
from megatron_biglm.checkpoint.files import RunFiles
from megatron_biglm.checkpoint.run_checkpoint import locate
from megatron_biglm.checkpoint.signature import model_signature, read_train_state
from megatron_biglm.checkpoint.space import check_room, checkpoint_bytes, save_errors
from megatron_biglm.checkpoint.verify import verify_checkpoint
from megatron_biglm.common import host_memory
from megatron_biglm.config import (
    ConfigError,
    RunConfig,
    check_batch_arithmetic,
    check_sequence_fits,
    derive,
    save_resolved,
)
from megatron_biglm.config.finetune_section import INIT_KEY
from megatron_biglm.data.pretrain_data import make_loader
from megatron_biglm.data.tokenizer import tokenizer_digest
from megatron_biglm.evaluation.training_hook import ZeroShotTrainingHook
from megatron_biglm.inference.megatron_adapter import megatron_adapter_for
from megatron_biglm.model.shape import shape_of
from megatron_biglm.training import build, distributed, loop
from megatron_biglm.training.backends import BuildSpec, check_resume, select_backend
from megatron_biglm.training.callbacks import Callbacks
from megatron_biglm.training.flops import default_peak_tflops
from megatron_biglm.training.loop_state import checkpoint_state, restore_state
from megatron_biglm.training.metrics import MetricsLogger
from megatron_biglm.training.nonfinite import NonFiniteGuard
from megatron_biglm.training.pretrain_recipe import PretrainRecipe
from megatron_biglm.training.schedule import build_scheduler
from megatron_biglm.training.signals import GracefulStop

from .run_lock import run_dir_lock

log = logging.getLogger("megatron_biglm.run.train")


@dataclass
class TrainResult:
    iteration: int
    consumed_samples: int
    last_loss: float
    first_val_loss: float | None
    last_val_loss: float | None
    stopped_by: str | None
    skipped_nonfinite: int
    checkpoint: str | None
    run_dir: str
    resumed_from: str | None
    initialized_from: str | None = None  # the weights-only checkpoint a fresh run took its weights from


def _iterate_forever_guard(loader, what: str):
    """A loader iterator that explains itself if the dataset runs out (it never should:
    datasets are built for exactly train_steps × global_batch_size samples)."""
    for batch in loader:
        yield batch
    raise RuntimeError(f"{what} ran out of samples; this is a bug in the sample budget")


def train(cfg: RunConfig, *, recipe=None, callbacks=()) -> TrainResult:
    """Run (or resume) training as `cfg` says; return a summary on every rank.

    `recipe`: what is trained (datasets, forward/loss, metrics; training/recipe.py); None is
    BiGLM pretraining (training/pretrain_recipe.py). `callbacks`: functions `f(step, loop_state)`
    or objects implementing the loop's events (training/callbacks.py: `on_start`, `on_step`, `on_save`,
    `on_log`, `on_evaluate`), checked before anything is built; the config's `zero_shot_eval`
    adds one.
    A fine-tune's `finetune.init_from`: a checkpoint of any kind (a pretraining run, an HF
    import) whose model weights a run without checkpoints of its own starts from, with a fresh
    optimizer and schedule; once the run has saved, `checkpoint.load` (auto) resumes those instead.
    """
    if not isinstance(cfg, RunConfig):
        raise TypeError(f"train() takes a loaded RunConfig (megatron_biglm.config.load_config), got {type(cfg).__name__}")
    callbacks = Callbacks(callbacks)  # a callback with no event is refused before anything is built
    with run_dir_lock(cfg.run_dir):  # one run per run_dir, held for the run's life (run_lock.py)
        return _train(cfg, recipe, callbacks)


def _train(cfg: RunConfig, recipe, callbacks) -> TrainResult:
    cfg = _pin_tokenizer(cfg)
    recipe = recipe if recipe is not None else PretrainRecipe()
    backend = select_backend(cfg.training.backend)
    info = distributed.init_distributed(cfg.parallelism, cfg.training.seed)
    if info.device.type == "cpu":
        host_memory.keep_freed_memory()  # a CPU step's tensors live in host memory: reuse it
    try:
        run = _prepare(cfg, info, recipe)
        start = _choose_start(cfg, info, backend, run)
        parts = _build(cfg, backend, run, start, recipe)
        callbacks.start()  # every check has passed; nothing is written to run_dir before this
        metrics = _announce(cfg, info, backend, run, start, parts)
        state = _loop(cfg, info, backend, run, parts, metrics, recipe, callbacks)
        return _finish(cfg, info, parts, state, start)
    finally:
        backend.shutdown(info)


def _pin_tokenizer(cfg: RunConfig) -> RunConfig:
    """The tokenizer directory is saved absolute (in the run's config.yaml and every
    checkpoint), so the checkpoints find it from anywhere, with the digest of its files
    (`data.tokenizer_sha256`), so a tokenizer changed since is refused where it is loaded."""
    path = Path(cfg.data.tokenizer).expanduser() if cfg.data.tokenizer else None
    if path is None or not path.is_dir():
        return cfg
    return derive(cfg, data=dataclasses.replace(
        cfg.data, tokenizer=str(path.resolve()), tokenizer_sha256=tokenizer_digest(path)))


@dataclass
class _Run:
    """What the config resolves to before anything is built."""
    num_micro: int
    precision: str
    model_config: object
    signature: dict
    data: object  # the recipe's RecipeData


@dataclass
class _Start:
    """Where the weights come from: `load` resumes a run, `init` takes weights only."""
    load: Path | None
    init: Path | None
    note: str | None
    verified: str | None


@dataclass
class _Parts:
    model_chunks: list
    optimizer: object
    scheduler: object
    guard: object
    state: object        # loop.LoopState, restored on resume
    stateful: dict       # what a checkpoint saves besides the loop state


def _prepare(cfg, info, recipe) -> _Run:
    """Batch arithmetic, precision, the kernel report, the model config and the recipe's data."""
    num_micro = check_batch_arithmetic(cfg, info.dp)
    precision = build.resolve_precision(cfg.training)
    mc = cfg.model.resolved
    kernels = build.kernels(mc, precision)  # refuses a named kernel that is not installed
    if info.is_logger:
        print(kernels, flush=True)
    check_sequence_fits(cfg)
    signature = model_signature({**mc.to_dict(), "padded_vocab_size": mc.padded_vocab_size})
    return _Run(num_micro, precision, mc, signature, recipe.build_data(cfg, mc, info.dp))


def _choose_start(cfg, info, backend, run: _Run) -> _Start:
    """Resume this run, start from another checkpoint's weights, or start fresh. Every rank
    checks (shared filesystem), so a refusal stops all ranks and none hangs."""
    start = checkpoint_dir.choose_start(cfg.checkpoint_dir, cfg.checkpoint.load)
    key = checkpoint_dir.LOAD_KEY  # the config key that named the start, for the refusals
    init_from = cfg.finetune.init_from if cfg.finetune.enabled else None
    if start.path is None and init_from and cfg.checkpoint.load == "auto":
        start, key = _initial_weights(init_from), INIT_KEY
    init_path = start.path if start.weights_only else None  # weights only: a start, not a resume
    load_path = None if start.weights_only else start.path
    verified = None
    if start.path is not None:
        saved_state = read_train_state(start.path, run.signature)  # refuses another model shape
        if load_path is not None:
            check_resume(saved_state, backend, start.path, info.dp)
        verified = (verify_checkpoint(start.path, collective=True, key=key).note() if cfg.checkpoint.verify else
                    f"checkpoint.verify=false: {start.path} was loaded without its CRC-32 check")
    return _Start(load_path, init_path, start.note, verified)


def _build(cfg, backend, run: _Run, start: _Start, recipe) -> _Parts:
    """Model, optimizer, schedule and the non-finite guard; on resume, their saved states."""
    spec = BuildSpec(run.model_config, run.precision, run.num_micro, cfg.training, cfg.optimizer,
                     reinit_mismatched_heads=cfg.finetune.reinit_mismatched_heads)
    model_chunks, optimizer = backend.build(spec, init_weights=start.init, provider=recipe.model_provider)
    scheduler = build_scheduler(optimizer, cfg.schedule, cfg.optimizer)
    guard = NonFiniteGuard(cfg.training.max_nonfinite_in_a_row)
    state = loop.LoopState(tokens_per_sample=cfg.data.seq_length)
    stateful = {"nonfinite": guard, "recipe": recipe}
    if start.load is not None:
        restore_state(backend.load(start.load, model_chunks, optimizer, scheduler), state, stateful)
    return _Parts(model_chunks, optimizer, scheduler, guard, state, stateful)


def _announce(cfg, info, backend, run: _Run, start: _Start, parts: _Parts):
    """Open the metrics; on the logging rank save the resolved config and say how the run starts."""
    metrics = MetricsLogger(cfg.run_dir, enabled=info.is_logger, total_steps=cfg.schedule.train_steps,
                            tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb,
                            wandb_project=cfg.logging.wandb_project, progress=cfg.logging.progress,
                            config=cfg.to_dict(), start_step=parts.state.iteration)
    if info.is_logger:
        save_resolved(cfg, Path(cfg.run_dir) / "config.yaml")
        print("resolved config:\n" + cfg.to_yaml(), flush=True)
        for note in metrics.notes + [n for n in (start.note, start.verified) if n]:
            metrics.message(note)
        metrics.message(
            f"{backend.name} backend; world {info.world_size} = TP {info.tp} × PP {info.pp} × DP {info.dp}; "
            f"{run.num_micro} micro-batches of {cfg.training.micro_batch_size} per step; precision "
            f"{run.precision}; "
            + (f"resumed from {start.load} at step {parts.state.iteration}" if start.load else
               f"starting at step 0 from the weights of {start.init} (a weights-only checkpoint: fresh "
               f"optimizer and LR schedule)" if start.init else "starting fresh"))
    return metrics


def _loop(cfg, info, backend, run: _Run, parts: _Parts, metrics, recipe, callbacks):
    """The data iterators, the checkpoint writer and the callbacks, handed to the one loop.
    Every checkpoint seals the resolved config and the recipe's own records (a fine-tune's
    task_head.json) with its shards."""
    data, mbs = run.data, cfg.training.micro_batch_size
    collate = {"collate_fn": data.collate_fn} if data.collate_fn is not None else {}

    def train_iter(consumed):
        loader = make_loader(data.train, consumed, mbs, info.dp_rank, info.dp,
                             num_workers=cfg.data.num_workers, **collate)
        return _iterate_forever_guard(loader, "the training set")

    def valid_iter():
        loader = make_loader(data.valid, 0, mbs, info.dp_rank, info.dp, **collate)
        return itertools.cycle(loader) if len(loader) else iter(())

    def save(st):
        files = RunFiles(cfg.to_yaml(), cfg.checkpoint.keep_last, recipe.checkpoint_files())
        needed = checkpoint_bytes(cfg.checkpoint_dir, (p for m in parts.model_chunks for p in m.parameters()))
        check_room(cfg.checkpoint_dir, needed)  # a full disk: one line, before a byte is written
        with save_errors(cfg.checkpoint_dir, needed):
                path = backend.save(cfg.checkpoint_dir, st.iteration, parts.model_chunks, parts.optimizer, parts.scheduler,
                                {**checkpoint_state(st, parts.stateful), "backend": backend.name}, files, run.signature)
        callbacks.save(st, path)
        return path

    callbacks = Callbacks([*callbacks, *_configured_callbacks(cfg, data.tokenizer, recipe)])
    with GracefulStop() as stop:
        comps = loop.Components(
            config=cfg, info=info, model_chunks=parts.model_chunks, optimizer=parts.optimizer,
            scheduler=parts.scheduler, guard=parts.guard, metrics=metrics, train_iter_fn=train_iter,
            valid_iter_fn=valid_iter if data.valid is not None and cfg.training.eval_iters > 0 else None,
            save_fn=save, stop=stop, model_shape=shape_of(run.model_config), num_microbatches=run.num_micro,
            recipe=recipe, peak_tflops=cfg.logging.peak_tflops or default_peak_tflops(), callbacks=callbacks,
            train_step_fn=backend.train_step, evaluate_fn=backend.evaluate, tokenizer=data.tokenizer)
        try:
            return loop.run(comps, parts.state)
        finally:
            metrics.close()


def _finish(cfg, info, parts: _Parts, state, start: _Start) -> TrainResult:
    """The summary; a run that reached its last step leaves `train_done.json` beside it."""
    latest = checkpoint_dir.complete_checkpoints(cfg.checkpoint_dir)
    result = TrainResult(
        iteration=state.iteration, consumed_samples=state.consumed_samples, last_loss=state.last_loss,
        first_val_loss=state.first_val_loss, last_val_loss=state.last_val_loss, stopped_by=state.stopped_by,
        skipped_nonfinite=parts.guard.total_skipped, checkpoint=str(latest[-1]) if latest else None,
        run_dir=str(cfg.run_dir), resumed_from=str(start.load) if start.load else None,
        initialized_from=str(start.init) if start.init else None)
    if info.is_logger and state.stopped_by is None and state.iteration >= cfg.schedule.train_steps:
        (Path(cfg.run_dir) / "train_done.json").write_text(json.dumps(result.__dict__, indent=1))
    return result


def _initial_weights(init_from):
    """The start point of a run that takes only the model weights of `init_from` (any
    megatron-biglm checkpoint folder, checkpoint root or run directory)."""
    return StartPoint(locate(init_from, INIT_KEY), weights_only=True)


def _configured_callbacks(cfg, tokenizer, recipe) -> list:
    """The loop callbacks the config asks for: zero-shot evaluation (`zero_shot_eval:`).
    Built here, above training/, so that training/ never imports evaluation/."""
    z = cfg.zero_shot_eval
    if not z.enabled:
        return []

    if tokenizer is None:
        raise ConfigError(f"zero_shot_eval needs a tokenizer, and the {recipe.name} recipe gives none")
    return [ZeroShotTrainingHook(z, tokenizer, make_adapter=partial(
        megatron_adapter_for, tokenizer=tokenizer, split_attention=cfg.objective.resolved.restricts_attention))]
