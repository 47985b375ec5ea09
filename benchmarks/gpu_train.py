"""The GPU benchmark's train-step sections: the real training loop against its bare twin.

Both sides run in this process, from one run config (the preset, the micro-batch and its
count, the precision, the objective, indexed data made on the spot: the lent device has no
corpus and no internet):

  loop  `run.train.train(cfg)`, exactly what `cli.train` runs (megatron's datasets and
        masking, the read-ahead DataLoader, megatron DDP and optimizer with fp32 main weights
        and gradient buffer in bf16, the schedule, the non-finite guard, logging; checkpoints
        off). A step callback synchronises the device and stamps the time after every step.
  bare  its twin: the same config through the same builders (`backend.build`, the recipe's
        data, `build_scheduler`) and the same `training.step.train_step`, fresh batches every
        step from the same DataLoader (the real objective at its real mask density, the same
        micro-batches), one device sync per step, nothing else around it. The batches are
        read before the step's clock starts (their time is reported as `data_s`).

Both report per-step times and their median over `steps` steps after `warmup` steps, and the
recompilations inside the timed steps. The bare side also times the phases of a step (data,
forward+backward, optimizer: the schedule's pieces with a sync between them) in extra steps;
the loop's own work is its median step less the bare forward+backward and optimizer.
`loop_vs_bare` = bare median step / loop median step (1.0: the loop costs nothing).

MFU is the **training step's**: useful model FLOPs (training/flops.py: 3 x forward,
split-aware attention pairs, predicted rows only through the output layer) over the step
time, over the device's dense bf16 peak; the loop's is its own logged figure.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import gpu_compile_counts


def make_data(folder: Path, tokenizer_vocab: int, tokens: int, seed: int = 0) -> tuple[str, str, int]:
    """(tokenizer dir, indexed-data prefix, tokenizer vocabulary size) under `folder`."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    from megatron_biglm.data.tokenizer import load_tokenizer, train_bpe_tokenizer

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = folder / "words.jsonl"
    with open(text, "w", encoding="utf-8") as f:
        for _ in range(2000):
            words = ("".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(40))
            f.write(json.dumps({"text": " ".join(words)}) + "\n")
    tok_dir = train_bpe_tokenizer([str(text)], tokenizer_vocab, folder / "tokenizer", json_keys=("text",))
    vocab = len(load_tokenizer(str(tok_dir)))
    prefix = str(folder / "random_text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
    gen = np.random.default_rng(seed)
    doc = 4096
    for _ in range(max(1, tokens // doc)):
        builder.add_item(torch.from_numpy(gen.integers(8, vocab, doc, dtype=np.int32)))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return str(tok_dir), prefix, vocab


def run_config(preset: str, *, tokenizer: str, prefix: str, seq: int, micro: int, num_micro: int, steps: int,
               precision: str, peak_tflops: float, workers: int, folder: Path):
    from megatron_biglm.config import load_config

    run_dir = folder / f"run_{preset}"
    config = folder / f"{preset}.yaml"
    config.write_text(f"run_dir: {run_dir}\n")
    overrides = {
        "model.preset": preset, "data.tokenizer": tokenizer, "data.blend": f"['{prefix}']",
        "data.seq_length": seq, "data.split": "98,2,0", "data.num_workers": workers,
        "training.micro_batch_size": micro, "training.global_batch_size": micro * num_micro,
        "training.precision": precision, "training.eval_interval": 0, "training.eval_iters": 0,
        "schedule.train_steps": steps, "schedule.warmup_steps": 1,
        "logging.log_interval": 10, "logging.tensorboard": False, "logging.progress": "plain",
        "logging.peak_tflops": peak_tflops,
        "checkpoint.save_interval": 10 ** 9, "checkpoint.save_at_end": False,
    }
    return load_config(str(config), [f"{k}={v}" for k, v in overrides.items()])


class _StepClock:
    """A loop step callback: sync, then stamp the time and the recompilations so far."""

    def __init__(self, device):
        self.device, self.stamps = device, [(time.perf_counter(), gpu_compile_counts.snapshot()["recompiles"])]

    def on_step(self, step, loop_state, ctx) -> None:  # noqa: ARG002 - the callback protocol
        _sync(self.device)
        self.stamps.append((time.perf_counter(), gpu_compile_counts.snapshot()["recompiles"]))


def _timed(stamps: list, warmup: int) -> tuple[list, int]:
    """(per-step seconds after `warmup` steps, recompilations in those steps)."""
    times = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])][warmup:]
    return times, stamps[-1][1] - stamps[warmup][1]


def run_loop(cfg, *, warmup: int, device) -> dict:
    """`train(cfg)` with a step clock; the median step after warm-up and the last logged window."""
    from megatron_biglm.run.train import train
    from megatron_biglm.training.metrics import read_metrics

    clock = _StepClock(device)
    before = gpu_compile_counts.snapshot()
    train(cfg, callbacks=[clock])
    times, recompiles = _timed(clock.stamps, warmup)
    records = [r for r in read_metrics(Path(cfg.run_dir) / "metrics.jsonl") if r.get("kind", "train") == "train"]
    steady = records[-1]
    seq, gbs = cfg.data.seq_length, cfg.training.global_batch_size
    step_s = statistics.median(times)
    return dict(runs="train() loop: megatron DDP + optimizer (fp32 main weights, grad buffer), read-ahead loader",
                steps_timed=len(times), step_s=step_s, step_times_s=times, tokens_per_s=gbs * seq / step_s,
                mfu=steady["mfu"], mfu_window=dict(tokens_per_s=steady["tokens_per_s"], steps=cfg.logging.log_interval),
                tflops_per_device=steady["tflops_per_device"], loss=steady["loss"], recompiles=recompiles,
                compile_counts=gpu_compile_counts.since(before))


def run_bare(cfg, *, warmup: int, steps: int, phase_steps: int, device, peak: float) -> dict:
    """The loop's twin (see the module docstring)."""
    from megatron_biglm.config import check_batch_arithmetic
    from megatron_biglm.data.pretrain_data import make_loader
    from megatron_biglm.model.shape import shape_of
    from megatron_biglm.training import build, distributed
    from megatron_biglm.training.backend_protocol import BuildSpec
    from megatron_biglm.training.backends import select_backend
    from megatron_biglm.training.flops import train_step_flops
    from megatron_biglm.training.nonfinite import NonFiniteGuard
    from megatron_biglm.training.optimizer_step import device_skipping_optimizers, device_step
    from megatron_biglm.training.pretrain_recipe import PretrainRecipe
    from megatron_biglm.training.recipe import split_report
    from megatron_biglm.training.schedule import build_scheduler
    from megatron_biglm.training.step import forward_backward, make_forward_step, reduce_reports, train_step

    recipe, backend = PretrainRecipe(), select_backend(cfg.training.backend)
    info = distributed.init_distributed(cfg.parallelism, cfg.training.seed)
    try:
        num_micro = check_batch_arithmetic(cfg, info.dp)
        precision = build.resolve_precision(cfg.training)
        mc = cfg.model.resolved
        data = recipe.build_data(cfg, mc, info.dp)
        spec = BuildSpec(mc, precision, num_micro, cfg.training, cfg.optimizer)
        chunks, optimizer = backend.build(spec, init_weights=None, provider=recipe.model_provider)
        scheduler = build_scheduler(optimizer, cfg.schedule, cfg.optimizer)
        guard = NonFiniteGuard(cfg.training.max_nonfinite_in_a_row)
        collate = {"collate_fn": data.collate_fn} if data.collate_fn is not None else {}
        mbs, seq = cfg.training.micro_batch_size, cfg.data.seq_length
        loader = iter(make_loader(data.train, 0, mbs, info.dp_rank, info.dp, num_workers=cfg.data.num_workers,
                                  **collate))
        kw = dict(num_microbatches=num_micro, seq_length=seq, micro_batch_size=mbs, device=info.device, recipe=recipe)

        def fetch():
            t0 = time.perf_counter()
            batches = [next(loader) for _ in range(num_micro)]
            return batches, time.perf_counter() - t0

        stamps, outs, data_s = [], [], []
        stamps.append((time.perf_counter(), gpu_compile_counts.snapshot()["recompiles"]))
        for i in range(warmup + steps):
            batches, fetched = fetch()
            data_s.append(fetched)
            t0 = time.perf_counter()
            out = train_step(chunks, optimizer, scheduler, guard, iter(batches), iteration=i + 1, **kw)
            _sync(info.device)
            stamps.append((stamps[-1][0] + time.perf_counter() - t0, gpu_compile_counts.snapshot()["recompiles"]))
            outs.append(out)
        times, recompiles = _timed(stamps, warmup)
        shape = shape_of(mc)
        flops = []
        for out in outs[warmup:]:
            _, tokens, _ = split_report(out.report.to(torch.float64).cpu(), recipe)
            splits = out.stats.splits
            flops.append(train_step_flops(shape, seq, num_micro * mbs, splits=splits if len(splits) == num_micro * mbs
                                          else None, predicted_tokens=tokens))
        predicted = [split_report(o.report.to(torch.float64).cpu(), recipe)[1] for o in outs[warmup:]]

        phases = {"data": [], "forward+backward": [], "optimizer": []}
        inner = device_skipping_optimizers(optimizer)
        for i in range(phase_steps):  # the same step in its pieces, a sync between them
            batches, fetched = fetch()
            t0 = time.perf_counter()
            for chunk in chunks:
                chunk.zero_grad_buffer()
            optimizer.zero_grad()
            losses = forward_backward(chunks, iter(batches), num_micro, seq, mbs,
                                      make_forward_step(info.device, recipe))
            _sync(info.device)
            t1 = time.perf_counter()
            report = reduce_reports(losses, info.device, recipe)
            scheduler.step(1)
            if inner is not None:
                device_step(optimizer, inner, guard, report[0] / report[1], warmup + steps + i + 1, report.device)
            else:
                optimizer.step()
            _sync(info.device)
            phases["data"].append(fetched)
            phases["forward+backward"].append(t1 - t0)
            phases["optimizer"].append(time.perf_counter() - t1)
        step_s, predicted = statistics.median(times), statistics.median(predicted)
        result = dict(runs=f"bare twin: the same builders and train_step, {num_micro} micro-batch(es) of {mbs}, "
                           f"fresh batches, {precision}, {'device-side' if inner is not None else 'megatron'} "
                           "optimizer step",
                      steps_timed=len(times), step_s=step_s, step_times_s=times,
                      tokens_per_s=num_micro * mbs * seq / step_s, mfu=statistics.median(flops) / step_s / peak,
                      predicted_tokens_per_step=predicted, predicted_fraction=predicted / (num_micro * mbs * seq),
                      data_s=statistics.median(data_s), recompiles=recompiles,
                      phases_s={k: statistics.median(v) for k, v in phases.items() if v})
        del chunks, optimizer, loader  # the loader's worker processes end with it
        return result
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def loop_vs_bare(args, results, section: str, preset: str, device, dtype, peak: float, *, bare: bool) -> dict:
    """One preset: the loop, then (`bare`) its twin; each row saved as soon as it exists (`results.row`)."""
    import tempfile

    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    micro, num_micro = args.batch.get(preset, 1), args.num_micro
    steps = args.warmup_steps + args.timed_steps
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokens = 2 * (steps + args.phase_steps + 4) * micro * num_micro * args.seq + 8192
        tokenizer, prefix, _ = make_data(folder, args.tokenizer_vocab, tokens)
        cfg = run_config(preset, tokenizer=tokenizer, prefix=prefix, seq=args.seq, micro=micro, num_micro=num_micro,
                         steps=steps, precision=precision, peak_tflops=peak / 1e12, workers=args.workers,
                         folder=folder)
        head = dict(preset=preset, batch=micro * num_micro, micro_batch=micro, num_micro=num_micro, seq=args.seq,
                    precision=precision, mfu_counts="training step: forward + backward + optimizer (+ loop)")
        for k, v in head.items():
            results.row(section, k, v)
        loop = run_loop(cfg, warmup=args.warmup_steps, device=device)
        results.row(section, "loop", loop)
        if not bare:
            return dict(head, loop=loop)
        twin = run_bare(cfg, warmup=args.warmup_steps, steps=args.timed_steps, phase_steps=args.phase_steps,
                        device=device, peak=peak)
        results.row(section, "bare", twin)
    phases = twin["phases_s"]
    loop["phases_s"] = {"data (bare twin's read; the loop reads ahead)": phases["data"],
                        "forward+backward (bare twin)": phases["forward+backward"],
                        "optimizer (bare twin)": phases["optimizer"],
                        "loop's own": loop["step_s"] - phases["forward+backward"] - phases["optimizer"]}
    return dict(head, loop=loop, bare=twin, loop_vs_bare=twin["step_s"] / loop["step_s"])


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
