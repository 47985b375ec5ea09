"""Pretrain BiGLM: `python -m megatron_biglm.train --config RUN.yaml [key=value ...]`.

Also under torchrun (`torchrun --nproc-per-node N -m megatron_biglm.train ...`), from SLURM
via launch/*.sh, and from Python as `train(config_or_path, overrides)`. See
megatron_biglm/training/ for the pieces and examples/configs/ for runs.

Where a run starts (`checkpoint.load`): `auto` resumes this run's latest checkpoint, `none`
starts fresh, a path resumes that checkpoint. A path to a weights-only checkpoint (an HF
import, `tools/convert_checkpoint.py from-hf`) starts from its weights with a fresh
optimizer and schedule at step 0, until this run saves its own checkpoints: from then on
the same command resumes those (checkpoint/dirs.py choose_start).
"""
from __future__ import annotations

import argparse
import itertools
import json
import logging
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("megatron_biglm.train")


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


def train(config_or_path, overrides=(), callbacks=(), forward_hook=None, recipe=None,
          init_from=None) -> TrainResult:
    """Run (or resume) training as configured; return a summary on every rank.

    `recipe`: what is trained (datasets, forward/loss, metrics; training/recipe.py); None is
    BiGLM pretraining (training/pretrain_recipe.py). `callbacks`: `cb(step, loop_state)`, or
    objects with `on_step(step, loop_state, ctx)` (ctx: training/loop.LoopContext: the live
    model, tokenizer, metrics), after each step; the config's `zero_shot_eval` adds one.
    `forward_hook`: wraps the loss computation for tests (e.g. to inject a NaN) as
    `hook(step, loss_tensor) -> tensor`. A callback with `on_save(loop_state, path)` hears of
    each checkpoint once it is sealed (fine-tuning's `best` pointer).
    `init_from`: a checkpoint of any kind (a pretraining run, an HF import) whose model weights
    a run without checkpoints of its own starts from, with a fresh optimizer and schedule
    (fine-tuning); once the run has saved, `checkpoint.load` (auto) resumes those instead.
    """
    import torch

    from megatron_biglm.checkpoint import dirs as checkpoint_dir
    from megatron_biglm.checkpoint.signature import model_signature, read_train_state
    from megatron_biglm.checkpoint.verify import verify_checkpoint
    from megatron_biglm.config import check_batch_arithmetic, load_config, save_resolved
    from megatron_biglm.data.pretrain_data import make_loader
    from megatron_biglm.training import build, distributed, loop
    from megatron_biglm.training.backends import check_resume, select_backend
    from megatron_biglm.model.shape import shape_of
    from megatron_biglm.training.flops import default_peak_tflops
    from megatron_biglm.training.loop_state import checkpoint_state, restore_state
    from megatron_biglm.training.metrics import MetricsLogger
    from megatron_biglm.training.nonfinite import NonFiniteGuard
    from megatron_biglm.training.pretrain_recipe import PretrainRecipe
    from megatron_biglm.training.schedule import build_scheduler
    from megatron_biglm.training.signals import GracefulStop

    cfg = load_config(config_or_path, list(overrides))
    recipe = recipe if recipe is not None else PretrainRecipe()
    backend = select_backend(cfg)
    info = distributed.init_distributed(cfg)
    try:
        num_micro = check_batch_arithmetic(cfg, info.dp)
        precision = build.resolve_precision(cfg)
        kernels = build.kernels(cfg, precision)  # refuses a named kernel that is not installed
        if info.is_logger:
            print(kernels, flush=True)
        mc = build.model_config(cfg)
        signature = model_signature({**mc.to_dict(), "padded_vocab_size": mc.padded_vocab_size})
        data = recipe.build_data(cfg, mc, info.dp)
        root = cfg.checkpoint_dir
        # Every rank checks (shared filesystem), so a refusal stops all ranks, none hangs.
        start = checkpoint_dir.choose_start(root, cfg.checkpoint.load)
        if start.path is None and init_from is not None and cfg.checkpoint.load == "auto":
            start = _initial_weights(init_from)
        init_path = start.path if start.weights_only else None  # weights only: a start, not a resume
        load_path = None if start.weights_only else start.path
        if start.path is not None:
            saved_state = read_train_state(start.path, signature)  # refuses another model shape
            if load_path is not None:
                check_resume(saved_state, backend, start.path, info.dp)
            verified = (verify_checkpoint(start.path, collective=True).note() if cfg.checkpoint.verify else
                        f"checkpoint.verify=false: {start.path} was loaded without its CRC-32 check")

        model_chunks, optimizer = backend.build(cfg, mc, precision, num_micro, init_weights=init_path,
                                                provider=recipe.model_provider)
        scheduler = build_scheduler(optimizer, cfg)
        guard = NonFiniteGuard(cfg.training.max_nonfinite_in_a_row)
        state = loop.LoopState(tokens_per_sample=cfg.data.seq_length)
        stateful = {"nonfinite": guard, "recipe": recipe}  # what a checkpoint saves besides the loop state
        if load_path is not None:
            restore_state(backend.load(load_path, model_chunks, optimizer, scheduler), state, stateful)
        if forward_hook is not None:
            _install_forward_hook(model_chunks, forward_hook, state)

        metrics = MetricsLogger(cfg.run_dir, enabled=info.is_logger, total_steps=cfg.schedule.train_steps,
                                tensorboard=cfg.logging.tensorboard, wandb=cfg.logging.wandb,
                                wandb_project=cfg.logging.wandb_project, progress=cfg.logging.progress,
                                config=cfg.to_dict(), start_step=state.iteration)
        if info.is_logger:
            save_resolved(cfg, Path(cfg.run_dir) / "config.yaml")
            print("resolved config:\n" + cfg.to_yaml(), flush=True)
            for note in metrics.notes + ([start.note] if start.note else []) + ([verified] if start.path else []):
                metrics.message(note)
            metrics.message(
                f"{backend.name} backend; world {info.world_size} = TP {info.tp} × PP {info.pp} × DP {info.dp}; "
                f"{num_micro} micro-batches "
                f"of {cfg.training.micro_batch_size} per step; precision {precision}; "
                + (f"resumed from {load_path} at step {state.iteration}" if load_path else
                   f"starting at step 0 from the weights of {init_path} (a weights-only checkpoint: fresh "
                   f"optimizer and LR schedule)" if init_path else "starting fresh"))

        collate = {"collate_fn": data.collate_fn} if data.collate_fn is not None else {}

        def train_iter(consumed):
            loader = make_loader(data.train, consumed, cfg.training.micro_batch_size, info.dp_rank, info.dp,
                                 num_workers=cfg.data.num_workers, **collate)
            return _iterate_forever_guard(loader, "the training set")

        def valid_iter():
            loader = make_loader(data.valid, 0, cfg.training.micro_batch_size, info.dp_rank, info.dp, **collate)
            return itertools.cycle(loader) if len(loader) else iter(())

        def save(st):
            path = backend.save(root, st.iteration, model_chunks, optimizer, scheduler,
                                {**checkpoint_state(st, stateful), "backend": backend.name}, cfg, signature)
            for cb in callbacks:
                if hasattr(cb, "on_save"):
                    cb.on_save(st, path)
            return path

        shape = shape_of(mc)
        callbacks = list(callbacks) + _configured_callbacks(cfg, data.tokenizer, recipe)
        with GracefulStop() as stop:
            comps = loop.Components(
                config=cfg, info=info, model_chunks=model_chunks, optimizer=optimizer, scheduler=scheduler,
                guard=guard, metrics=metrics, train_iter_fn=train_iter,
                valid_iter_fn=valid_iter if data.valid is not None and cfg.training.eval_iters > 0 else None,
                save_fn=save, stop=stop, model_shape=shape, num_microbatches=num_micro, recipe=recipe,
                peak_tflops=cfg.logging.peak_tflops or default_peak_tflops(), callbacks=callbacks,
                train_step_fn=backend.train_step, evaluate_fn=backend.evaluate, tokenizer=data.tokenizer)
            try:
                state = loop.run(comps, state)
            finally:
                metrics.close()
        latest = checkpoint_dir.complete_checkpoints(root)
        result = TrainResult(
            iteration=state.iteration, consumed_samples=state.consumed_samples, last_loss=state.last_loss,
            first_val_loss=state.first_val_loss, last_val_loss=state.last_val_loss, stopped_by=state.stopped_by,
            skipped_nonfinite=guard.total_skipped, checkpoint=str(latest[-1]) if latest else None,
            run_dir=str(cfg.run_dir), resumed_from=str(load_path) if load_path else None,
            initialized_from=str(init_path) if init_path else None)
        if info.is_logger and state.stopped_by is None and state.iteration >= cfg.schedule.train_steps:
            (Path(cfg.run_dir) / "train_done.json").write_text(json.dumps(result.__dict__, indent=1))
        return result
    finally:
        backend.shutdown(info)


def _initial_weights(init_from):
    """The start point of a run that takes only the model weights of `init_from` (any
    megatron-biglm checkpoint folder, checkpoint root or run directory)."""
    from megatron_biglm.checkpoint.dirs import StartPoint
    from megatron_biglm.checkpoint.run_checkpoint import locate

    return StartPoint(locate(init_from), weights_only=True)


def _configured_callbacks(cfg, tokenizer, recipe) -> list:
    """The loop callbacks the config asks for: zero-shot evaluation (`zero_shot_eval:`).
    Built here, on the top floor, so that training/ never imports evaluation/."""
    z = cfg.zero_shot_eval
    if not z.enabled:
        return []
    from functools import partial

    from megatron_biglm.inference.megatron_adapter import megatron_adapter_for
    from megatron_biglm.evaluation.training_hook import ZeroShotTrainingHook
    from megatron_biglm.config import ConfigError

    if tokenizer is None:
        raise ConfigError(f"zero_shot_eval needs a tokenizer, and the {recipe.name} recipe gives none")
    return [ZeroShotTrainingHook(z, tokenizer, make_adapter=partial(
        megatron_adapter_for, tokenizer=tokenizer, split_attention=cfg.objective.resolved.restricts_attention))]


def _install_forward_hook(model_chunks, hook, state):
    """Route each micro-batch's per-token loss through `hook(step, loss)` (tests only)."""
    module = model_chunks[0].module
    original = module.forward

    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        if kwargs.get("labels") is not None and module.post_process:
            out = hook(state.iteration + 1, out)
        return out

    module.forward = forward


def cli_main(argv, *, description: str, config_help: str, overrides_help: str, run, summary) -> int:
    """A run's command line: `--config FILE` and `section.key=value` overrides go to
    `run(config, overrides)`; `summary(result)` is printed as one JSON line (exit 0). A config,
    checkpoint or non-finite-loss error is printed as `error: ...` (exit 2, 3 for non-finite)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help=config_help)
    parser.add_argument("overrides", nargs="*", help=overrides_help)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.config import ConfigError
    from megatron_biglm.training.nonfinite import TooManyNonFinite
    try:
        result = run(args.config, args.overrides)
    except (ConfigError, CheckpointError, TooManyNonFinite) as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 2 if not isinstance(exc, TooManyNonFinite) else 3
    print(json.dumps(summary(result)), flush=True)
    return 0


def main(argv=None) -> int:
    return cli_main(argv, description=__doc__, config_help="run config YAML (see examples/configs/)",
                    overrides_help="section.key=value overrides, e.g. optimizer.lr=3e-4",
                    run=train, summary=lambda result: {"result": result.__dict__})

if __name__ == "__main__":
    sys.exit(main())
