"""The GPU benchmark's `train` section: the real training loop against a bare step.

For each preset, on data made on the spot (the lent device has no corpus and no internet):

  loop  `python -m megatron_biglm.cli.train` in a subprocess, exactly as a user runs it
        (indexed data through megatron's datasets, masking, DataLoader, megatron DDP and
        optimizer, schedule, logging; checkpoints off), for 2 x `steps` steps logged every
        `steps`: the second logging window is the steady state (warm-up and compilation fall
        in the first). Its tokens/s and MFU are the loop's own figures from metrics.jsonl;
  bare  the same model shape built standalone, forward + backward + AdamW (fused on CUDA,
        gradients clipped at 1.0) over pre-made device batches in a plain loop, timed over
        `steps` steps after `steps` warm-up steps, with one device sync at the end.

MFU here is the **training step's**: useful model FLOPs (training/flops.py: 3 x forward,
split-aware attention pairs, masked rows only through the output layer) over the time of
forward, backward, optimizer and (for the loop) everything around them, per device, over
the device's dense bf16 peak. `loop_vs_bare` is loop tokens/s over bare tokens/s: what the
loop costs (1.0 = nothing).

The data: a BPE tokenizer trained on seeded random words, and random token ids (below the
tokenizer's vocabulary) written with megatron-core's `IndexedDatasetBuilder`.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


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


def run_loop(preset: str, *, tokenizer: str, prefix: str, seq: int, batch: int, steps: int, precision: str,
             peak_tflops: float, workers: int, folder: Path) -> dict:
    """The real loop in a subprocess; its steady-state (last) logging window."""
    run_dir = folder / f"run_{preset}"
    config = folder / f"{preset}.yaml"
    config.write_text(f"run_dir: {run_dir}\n")
    overrides = {
        "model.preset": preset, "data.tokenizer": tokenizer, "data.blend": f"['{prefix}']",
        "data.seq_length": seq, "data.split": "98,2,0", "data.num_workers": workers,
        "training.micro_batch_size": batch, "training.global_batch_size": batch,
        "training.precision": precision, "training.eval_interval": 0, "training.eval_iters": 0,
        "schedule.train_steps": 2 * steps, "schedule.warmup_steps": 1,
        "logging.log_interval": steps, "logging.tensorboard": False, "logging.progress": "plain",
        "logging.peak_tflops": peak_tflops,
        "checkpoint.save_interval": 10 ** 9, "checkpoint.save_at_end": False,
    }
    cmd = [sys.executable, "-m", "megatron_biglm.cli.train", "--config", str(config),
           *[f"{k}={v}" for k, v in overrides.items()]]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"train() of {preset} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    from megatron_biglm.training.metrics import read_metrics

    records = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("kind", "train") == "train"]
    steady = records[-1]
    return dict(steps_timed=steps, tokens_per_s=steady["tokens_per_s"], mfu=steady["mfu"],
                tflops_per_device=steady["tflops_per_device"], loss=steady["loss"],
                wall_s=time.perf_counter() - t0)


def run_bare(preset: str, *, vocab: int, seq: int, batch: int, steps: int, device, dtype, peak: float) -> dict:
    """Forward, backward and AdamW over pre-made batches, in a plain loop."""
    from megatron_biglm.model import load_preset, model_provider
    from megatron_biglm.model.shape import shape_of
    from megatron_biglm.model.standalone import init_single_process
    from megatron_biglm.training.flops import train_step_flops

    init_single_process(seed=0)
    cfg = load_preset(preset, {"attention_backend": "auto", "seq_length": seq})
    params_dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    model = model_provider(True, True, cfg, params_dtype=params_dtype).to(device)
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=fused)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        split = torch.randint(seq // 5, seq - seq // 5, (batch,), generator=g)
        data = dict(tokens=torch.randint(8, vocab, (batch, seq), generator=g),
                    labels=torch.randint(8, vocab, (batch, seq), generator=g),
                    loss_mask=(torch.rand(batch, seq, generator=g) < 0.15).float())
        batches.append((split, {k: v.to(device) for k, v in data.items()}))

    def step(i):
        split, data = batches[i % len(batches)]
        losses = model(data["tokens"], split=split, labels=data["labels"], loss_mask=data["loss_mask"])
        loss = (losses.float() * data["loss_mask"]).sum() / data["loss_mask"].sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for i in range(steps):
        step(i)
    _sync(device)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    _sync(device)
    sec = (time.perf_counter() - t0) / steps
    flops = sum(train_step_flops(shape_of(cfg), seq, batch, splits=s.tolist(), predicted_tokens=int(d["loss_mask"].sum()))
                for s, d in batches) / len(batches)
    attention_backend = getattr(model, "attention_backend", cfg.attention_backend)
    del model, opt, batches
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return dict(steps_timed=steps, step_s=sec, tokens_per_s=batch * seq / sec, mfu=flops / sec / peak,
                attention_backend=attention_backend)


def train_section(args, device, dtype, peak: float) -> dict:
    """Loop and bare step per preset; the largest preset's figures are the headline."""
    precision = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        tokens = 2 * args.train_steps * max(args.batch.values()) * args.seq * 2 + 8192
        tokenizer, prefix, vocab = make_data(folder, args.tokenizer_vocab, tokens)
        for preset in args.presets:
            batch = args.batch.get(preset, 1)
            loop = run_loop(preset, tokenizer=tokenizer, prefix=prefix, seq=args.seq, batch=batch,
                            steps=args.train_steps, precision=precision, peak_tflops=peak / 1e12,
                            workers=args.workers, folder=folder)
            bare = run_bare(preset, vocab=vocab, seq=args.seq, batch=batch, steps=args.train_steps,
                            device=device, dtype=dtype, peak=peak)
            rows.append(dict(preset=preset, batch=batch, seq=args.seq, precision=precision,
                             mfu_counts="training step: forward + backward + optimizer (+ loop)",
                             loop=loop, bare=bare, loop_vs_bare=loop["tokens_per_s"] / bare["tokens_per_s"]))
    return dict(presets=rows, train_step_mfu=rows[-1]["loop"]["mfu"], train_loop_vs_bare=rows[-1]["loop_vs_bare"])


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
