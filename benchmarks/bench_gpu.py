"""The one-command GPU acceptance run, in one 10-minute call: what matters most comes first.

    python -m benchmarks gpu --out DIR [--sections train attention ...] [--peak-tflops X]
    python -m benchmarks gpu --dry-run --out DIR   # every section on CPU, tiny shapes (CI runs it)

Sections, in this order (`--sections` picks some; the order stays). `DIR/gpu_acceptance.json`
is rewritten after each one, so whatever the time allows comes back:

  train       the real `train()` (cli.train in a subprocess, indexed data and a tokenizer made
              on the spot, checkpoints off) on the 136M and 1.3B presets at the micro-batch and
              sequence below, against a bare forward + backward + AdamW step of the same shape
              over pre-made batches (`benchmarks/gpu_train.py`): steady-state tokens/s,
              training-step MFU, and `train_loop_vs_bare`.
  attention   one layer's split attention vs plain non-causal attention (flash, else SDPA) at
              s = 2048, the 1.3B preset's heads, batch 8, forward and forward + backward, each the
              median of >= 20 repetitions timed with CUDA events (`bench_attention.measure`).
  longform    1,024 tokens in blocks of 32 after a 128-token prompt, 136M preset shape, bf16, at
              batch 1 and 8: the exact cache vs its reference vs LLaDA's canvas re-run
              (`bench_longform.run`). `--longform-backend megatron` (default): our model with the
              slot-pool cache, the growing cache as reference; `hf`: EuroBERT's growing cache, the
              uncached block-causal forward as reference. Identity with the reference and every
              output's length are checked before any speed; repetitions are interleaved.
  eval        zero-shot scoring with eval's prefix cache on vs off (`benchmarks.bench_eval`): the
              HF export (transformers' cache) and its megatron checkpoint with the slot pool,
              each prompt's continuations scored in one batch against its slot.
  generation  Mask-Predict (T=10, N=64) with our model of the first preset's true shape and the
              slot-pool cache vs a same-shape Llama at its best (HF static cache, forward compiled
              with `reduce-overhead`), in the run's dtype, generated tokens/s, interleaved.
  parity      bf16 forward + backward of each split-attention kernel (local, sdpa, flex,
              sdpa_split, varlen where torch has it, flash when flash-attn imports) on one layer's q/k/v, against sdpa in fp32 on the
              same (bf16-rounded) inputs: max |diff| / max |reference| of the output and of
              dq, dk, dv. Mixed splits (0, a full prefix, random). Tolerance 2e-2 in bf16.
  serve       `python -m benchmarks serve` on this device: a real `biglm-serve` subprocess (the
              tiny preset's HF export), the same sampled requests sent one after another and by 16
              concurrent clients, outputs checked identical; requests/s, p50/p99 latency and
              `serve_concurrent_vs_sequential`.
  throughput  (only when named) fwd+bwd without optimizer of our model vs transformers'
              `EuroBertForMaskedLM` holding the same weights (`benchmarks.bench_model`): a
              like-for-like row (same SDPA kernel and dense mask, full logits on both sides)
              and the as-trained row (our split kernel and sparse head), each side's MFU over
              its own FLOPs.

The JSON's top level holds the headline figures: `train_step_mfu`, `train_loop_vs_bare`,
`split_vs_plain`, `longform_cached_vs_canvas` (the smaller over batch sizes),
`longform_identical`, `eval_cache_speedup` (the smallest over rules and backends),
`mask_predict_vs_ar`, `serve_concurrent_vs_sequential`. MFU is always labelled by what it counts.

Peak bf16 FLOP/s comes from `training.flops.peak_tflops_for` by the device's full name (H100
SXM and H200: 989, H100 PCIe: 756, H100 NVL: 835 TFLOP/s dense), `--peak-tflops` overrides
it; on a device in neither (the CPU of a dry run) a large matmul is timed in the same run and
used as the peak (`peak_source` says which).

`--dry-run` runs every section with the same code on CPU with tiny shapes (the `tiny` preset
at seq 128 stands in for both presets, fp32, one torch thread): it checks the script, not the
hardware. Its goals are printed but mean nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

JSON_NAME, MD_NAME = "gpu_acceptance.json", "gpu_acceptance.md"
SECTIONS = ("train", "attention", "longform", "eval", "generation", "parity", "serve")
OPTIONAL_SECTIONS = ("throughput",)
GOALS = {"train_step_mfu": 0.50, "split_vs_plain": 1.0, "longform_cached_vs_canvas": 3.0,
         "eval_cache_speedup": 2.0, "serve_concurrent_vs_sequential": 4.0}
PARITY_TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def peak_flops(device: torch.device, dtype: torch.dtype, override_tflops: float | None) -> tuple[float, str]:
    """(peak FLOP/s, where it came from): the override, the device table, or a timed matmul."""
    from megatron_biglm.training.flops import peak_tflops_for

    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    name = device_name(device)
    if device.type == "cuda" and (found := peak_tflops_for(name)) is not None:
        key, tflops = found
        return tflops * 1e12, f"table ({key}, bf16 dense)"
    n = 1024 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    a @ a
    _sync(device)
    reps, t0 = 3, time.perf_counter()
    for _ in range(reps):
        a @ a
    _sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t0), f"measured {n}x{n} {dtype} matmul"


# ------------------------------------------------------------------ parity
def attention_parity(args, device: torch.device, dtype: torch.dtype) -> dict:
    """Each split kernel in `dtype` against sdpa in fp32: relative max error of out, dq, dk, dv."""
    from benchmarks.bench_attention import make_core_attention
    from megatron_biglm.model.attention_params import (build_attention_params, flash_attn_available, resolve_compile,
                                                       torch_varlen_available)

    s, b, heads, groups, d = args.parity_seq, 3, args.heads, args.groups, args.head_dim
    g = torch.Generator().manual_seed(1)
    split = torch.tensor([0, s, int(torch.randint(1, s, (1,), generator=g))])
    qkv32 = [torch.randn(s, b, n, d, generator=g).to(device, dtype).float() for n in (heads, groups, groups)]
    weight = torch.randn(s, b, heads * d, generator=g).to(device)
    compiled = resolve_compile("auto", device)

    def run(core, backend, run_dtype, grad=True):
        params = build_attention_params(split, s, backend, device=device, compile_flex=compiled)
        # fresh leaves per run: `.to()` of a same-dtype tensor returns the tensor itself, and
        # sharing leaves would accumulate every kernel's gradients into the reference's
        q, k, v = (t.detach().to(run_dtype, copy=True).requires_grad_(grad) for t in qkv32)
        out = core(q, k, v, None, packed_seq_params=params)
        if not grad:
            return out.float(), None
        (out.float() * weight).sum().backward()
        return out.float(), [t.grad.float() for t in (q, k, v)]

    ref_out, ref_grads = run(make_core_attention(heads, groups, d).to(device), "sdpa", torch.float32)
    core = make_core_attention(heads, groups, d, dtype).to(device)
    half = dtype != torch.float32
    backends = (["local", "sdpa", "flex", "sdpa_split"] + (["varlen"] if torch_varlen_available() and half else [])
                + (["flash"] if flash_attn_available() and half else []))
    tol = PARITY_TOL[dtype]
    rows = {}
    for backend in backends:
        row = {}
        try:
            out, grads = run(core, backend, dtype)
        except NotImplementedError as exc:  # torch 2.13 has no FlexAttention backward on CPU
            out, grads = run(core, backend, dtype, grad=False)
            row["backward"] = f"not run: {exc}"
        pairs = [("out", out, ref_out)] + ([] if grads is None else list(zip(("dq", "dk", "dv"), grads, ref_grads)))
        for name, got, want in pairs:
            row[f"{name}_rel_err"] = float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))
        row["ok"] = all(v <= tol for k, v in row.items() if k.endswith("_rel_err"))
        rows[backend] = row
    return dict(dtype=str(dtype).replace("torch.", ""), seq=s, tolerance=tol, splits=split.tolist(), kernels=rows)


# ------------------------------------------------------------------ throughput
def preset_throughput(preset: str, args, device: torch.device, dtype: torch.dtype, peak: float) -> dict:
    """Our model vs `EuroBertForMaskedLM` holding the same weights, fwd+bwd, same batch, two rows:

    - like-for-like: both run SDPA with the same dense split mask and project every position to
      the vocabulary, so they do the same work; both MFUs count full attention and all rows;
    - as-trained: ours with the best split kernel and sparse prediction against the same
      reference; each side's MFU counts its own work (ours: the split's pairs and the predicted
      rows; the reference: full attention and every row)."""
    from benchmarks.bench_model import build_pair, step_ours, step_ref
    from megatron_biglm.model.shape import shape_of
    from megatron_biglm.training.flops import train_step_flops

    batch = args.batch.get(preset, 1)
    cfg, ours, ref, data = build_pair(batch, args.seq, preset=preset, backend="auto", device=device, dtype=dtype)
    best = ours.attention_backend
    shape = shape_of(cfg)
    full_flops = train_step_flops(shape, args.seq, batch)
    own_flops = train_step_flops(shape, args.seq, batch, splits=data["split"].tolist(),
                                 predicted_tokens=int(data["loss_mask"].sum()))

    def ours_step(backend, sparse):
        def run():
            ours.attention_backend = backend
            return step_ours(ours, data, sparse)
        return run

    sides = {"like_for_like": {"ours": (ours_step("sdpa", False), full_flops)},
             "as_trained": {"ours": (ours_step(best, True), own_flops)}}
    reference = (lambda: step_ref(ref, data, cfg.vocab_size), full_flops)
    losses = {name: float(fn()) for name, (fn, _) in
              (("ours_full", sides["like_for_like"]["ours"]), ("ours_sparse", sides["as_trained"]["ours"]),
               ("reference", reference))}
    timed = {"ours sdpa full logits": sides["like_for_like"]["ours"][0],
             f"ours {best} sparse": sides["as_trained"]["ours"][0], "reference": reference[0]}
    for _ in range(args.warmup):
        for fn in timed.values():
            fn()
    times = {name: [] for name in timed}
    for _ in range(args.steps):  # interleaved, so load changes hit every side alike
        for name, fn in timed.items():
            ours.zero_grad(set_to_none=True)
            ref.zero_grad(set_to_none=True)
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    ours.attention_backend = best

    def side(name, flops):
        sec = statistics.median(times[name])
        return dict(step_s=sec, tokens_per_s=batch * args.seq / sec, step_flops=flops,
                    mfu=flops / sec / peak, mfu_counts="forward+backward")

    ref_side = side("reference", full_flops)
    rows = {"like_for_like": dict(attention="sdpa, dense split mask, both", head="full logits, both",
                                  ours=side("ours sdpa full logits", full_flops), reference=ref_side,
                                  loss_diff=abs(losses["ours_full"] - losses["reference"])),
            "as_trained": dict(attention=f"ours {best}, reference sdpa dense mask",
                               head="ours sparse (predicted rows), reference full logits",
                               ours=side(f"ours {best} sparse", own_flops), reference=ref_side,
                               loss_diff=abs(losses["ours_sparse"] - losses["reference"]))}
    for r in rows.values():
        r["speedup_vs_reference"] = r["reference"]["step_s"] / r["ours"]["step_s"]
    result = dict(preset=preset, shape=dict(layers=cfg.num_layers, hidden=cfg.hidden_size,
                                            heads=cfg.num_attention_heads, groups=cfg.query_groups),
                  params=sum(p.numel() for p in ours.parameters()), batch=batch, seq=args.seq,
                  attention_backend=best, **rows)
    del ours, ref
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


# ------------------------------------------------------------------ attention
def split_vs_full_attention(args, device: torch.device, dtype: torch.dtype) -> dict:
    """fwd and fwd+bwd of one layer: plain non-causal attention vs each split kernel."""
    from benchmarks.bench_attention import available_backends, make_core_attention, measure
    from megatron_biglm.model.attention_params import resolve_backend

    cuda = device.type == "cuda"
    backends = available_backends(cuda) if cuda else ["full", "sdpa", "sdpa_split"]  # CPU: no flex backward
    best = resolve_backend("auto", dtype)
    opts = SimpleNamespace(batch=args.attn_batch, heads=args.heads, groups=args.groups,
                           head_dim=args.head_dim, reps=args.attn_reps, mask_reps=1, mask_baseline=False)
    core = make_core_attention(args.heads, args.groups, args.head_dim, dtype).to(device)
    rows = {b: measure(core, b, args.attn_seq, opts, device, dtype) for b in backends}
    full = rows.pop("full")
    fastest = min((b for b in rows if rows[b]["fwdbwd_ms"] is not None), key=lambda b: rows[b]["fwdbwd_ms"])
    return dict(fastest_split_kernel=fastest, fastest_split_vs_full_fwdbwd=full["fwdbwd_ms"] / rows[fastest]["fwdbwd_ms"],
                seq=args.attn_seq, batch=args.attn_batch, heads=args.heads, groups=args.groups,
                head_dim=args.head_dim, best_split_kernel=best, reps=full["reps"],
                timer="CUDA events, median" if cuda else "wall clock, median",
                full=dict(fwd_ms=full["fwd_ms"], fwdbwd_ms=full["fwdbwd_ms"]),
                split={b: dict(fwd_ms=r["fwd_ms"], fwdbwd_ms=r["fwdbwd_ms"]) for b, r in rows.items()},
                split_vs_full_fwd=full["fwd_ms"] / rows[best]["fwd_ms"],
                split_vs_full_fwdbwd=full["fwdbwd_ms"] / rows[best]["fwdbwd_ms"])


# ------------------------------------------------------------------ generation
def mask_predict_vs_ar(args, device: torch.device, dtype: torch.dtype) -> dict:
    """Generated tokens/s on the preset's true shape, in the run's dtype: Mask-Predict with our
    model and the slot-pool cache (steps replayed from CUDA graphs on a GPU) vs an autoregressive
    Llama of the same shape at its best: transformers' static K/V cache with its forward
    compiled (`torch.compile(mode="reduce-overhead")`, CUDA graphs), greedy. The dry run
    leaves the compile out (a CPU compile would take minutes) and says so in `ar_baseline`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.bench_generation import PAD, shapes, timed
    from benchmarks.bench_longform import random_megatron_model
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
    from megatron_biglm.model import load_preset

    preset = args.presets[0]
    cfg = load_preset(preset)
    b, n, steps, prefix = args.gen_batch, 64, 10, args.gen_prefix
    positions = 1 + prefix + n
    adapter, tokenizer, vocab = random_megatron_model(preset, positions, device, dtype, "pool")
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(4, vocab, (b, prefix), generator=g).tolist()
    ar_input = torch.tensor([[adapter.special.bos_id] + ids for ids in prompt_ids], device=device)
    llama = shapes(SimpleNamespace(vocab=vocab, hidden=cfg.hidden_size, layers=cfg.num_layers,
                                   prefix=prefix, new_tokens=n))
    llama.update(num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.query_groups,
                 intermediate_size=cfg.ffn_hidden_size, head_dim=cfg.head_dim,
                 max_position_embeddings=positions + 8)
    torch.manual_seed(0)
    clm = LlamaForCausalLM(LlamaConfig(**llama)).to(device, dtype).eval()
    compiled = device.type == "cuda"
    if compiled:
        clm.forward = torch.compile(clm.forward, mode="reduce-overhead", fullgraph=True)
    mp = MaskPredictGenerator(adapter, tokenizer, use_cache=True)
    config = GenerationConfig(length=n, steps=steps)

    def run_mp():
        return mp.generate_ids(prompt_ids, config, batch_size=b)

    def run_ar():
        return clm.generate(input_ids=ar_input, attention_mask=torch.ones_like(ar_input), max_new_tokens=n,
                            min_new_tokens=n, do_sample=False, cache_implementation="static", pad_token_id=PAD)

    with torch.no_grad():
        for _ in range(2 if compiled else 1):  # warm-up: graphs captured, compile done
            run_mp(), run_ar()
        mp_times, ar_times = [], []
        for _ in range(args.reps):  # interleaved, so a load change hits both alike
            mp_s, outs = timed(run_mp, 1, device)
            ar_s, out = timed(run_ar, 1, device)
            mp_times.append(mp_s)
            ar_times.append(ar_s)
    if not (all(len(o.ids) == n for o in outs) and out.shape[1] == ar_input.shape[1] + n):
        raise RuntimeError("a generator returned the wrong number of tokens; no speed is reported")
    mp_s, ar_s = statistics.median(mp_times), statistics.median(ar_times)
    return dict(preset=preset, layers=cfg.num_layers, hidden=cfg.hidden_size, heads=cfg.num_attention_heads,
                groups=cfg.query_groups, vocab=vocab, dtype=str(dtype).replace("torch.", ""), batch=b,
                prefix=prefix, new_tokens=n, steps=steps,
                mask_predict=("our model, slot-pool cache" + (", CUDA-graph steps" if adapter.step_graphs else "")),
                ar_baseline=("Llama, HF static cache, " + ("torch.compile reduce-overhead" if compiled
                                                           else "eager (dry run: no compile)")),
                mask_predict_tokens_per_s=b * n / mp_s, ar_tokens_per_s=b * n / ar_s,
                mask_predict_vs_ar=ar_s / mp_s)


# ------------------------------------------------------------------ eval
def eval_prefix_cache(args, device: torch.device) -> dict:
    """Zero-shot scoring requests/s with eval's prefix reuse off and on (same requests), for
    the HF export and its megatron checkpoint (both through the one inference loader)."""
    from benchmarks.bench_eval import (build_model, build_requests, eval_lms, megatron_checkpoint,
                                       sample_tokenizer, time_rule)

    rules = {}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, corpus = sample_tokenizer(Path(tmp), max_plays=1)
        pairs = build_requests(tokenizer, corpus, args.eval_questions, args.eval_context, *args.eval_choices)
        model = build_model(tokenizer, str(device))
        checkpoint = megatron_checkpoint(model, tokenizer, Path(tmp))
        sources = {"hf": ("hf", model, "grow"), "megatron(pool)": ("megatron", checkpoint, "pool")}
        for rule in args.eval_rules:
            for name, (backend, source, layout) in sources.items():
                lms = eval_lms(backend, source, tokenizer, rule, 16, str(device), cache_layout=layout)
                best, scores, passes = time_rule(lms, pairs, args.reps)
                rules[f"{name}:{rule}"] = dict(
                    passes_per_request=passes, requests_per_s_off=len(pairs) / best[False],
                    requests_per_s_on=len(pairs) / best[True], speedup=best[False] / best[True],
                    max_score_diff=max(abs(a - b) for a, b in zip(scores[False], scores[True])))
    return dict(requests=len(pairs), context_tokens=args.eval_context, rules=rules)


# ------------------------------------------------------------------ longform
def longform(args, device: torch.device, dtype: torch.dtype) -> dict:
    """The exact cache vs its uncached reference vs LLaDA's canvas (`bench_longform.run`)."""
    from benchmarks.bench_longform import DECODERS, run

    opts = SimpleNamespace(model=None, preset=args.presets[0], prompt_tokens=args.lf_prompt,
                           new_tokens=args.lf_new, block=args.lf_block, steps=args.lf_steps,
                           batches=args.lf_batches, decoders=list(DECODERS), device=str(device),
                           dtype={torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype], reps=args.reps,
                           backend=args.longform_backend)
    return dict(run(opts), backend=args.longform_backend)


# ------------------------------------------------------------------ serve
def serve_throughput(args) -> dict:
    """`bench_serve.run`: concurrent vs one-after-another requests through a real server (on
    CUDA when the device has it, as `biglm-serve` chooses)."""
    from benchmarks.bench_serve import run

    return run(SimpleNamespace(requests=args.serve_requests, clients=args.serve_clients,
                               max_tokens=args.serve_max_tokens, steps=8, block_size=args.serve_max_tokens // 2,
                               temperature=0.8, threads=1, reps=args.reps))


# ------------------------------------------------------------------ report
def summary(results: dict) -> dict:
    """The headline figures of the sections that ran (each from its own section)."""
    out = {}
    if "train" in results:
        out["train_step_mfu"] = results["train"]["train_step_mfu"]
        out["train_loop_vs_bare"] = results["train"]["train_loop_vs_bare"]
    if "attention" in results:
        out["split_vs_plain"] = results["attention"]["split_vs_full_fwdbwd"]
    if "longform" in results:
        runs = results["longform"]["runs"]
        out["longform_identical"] = all(r.get("identical") is True and r["lengths_ok"] for r in runs)
        out["longform_cached_vs_canvas"] = min(r["cached_vs_canvas"] for r in runs)
    if "eval" in results:
        out["eval_cache_speedup"] = min(r["speedup"] for r in results["eval"]["rules"].values())
    if "generation" in results:
        out["mask_predict_vs_ar"] = results["generation"]["mask_predict_vs_ar"]
    if "serve" in results:
        out["serve_concurrent_vs_sequential"] = results["serve"]["ratio"]
    return out


def goal_rows(results: dict) -> list[tuple[str, float, float]]:
    """(goal, measured, target) for each acceptance goal whose section ran."""
    names = {"train_step_mfu": "training-step MFU, largest preset (fwd+bwd+optimizer+loop)",
             "split_vs_plain": "split / plain non-causal attention (fwd+bwd)",
             "longform_cached_vs_canvas": "exact cache / canvas re-run, long-form (smaller batch ratio)",
             "eval_cache_speedup": "eval prefix cache / no cache (smallest rule)",
             "serve_concurrent_vs_sequential": "served requests/s, concurrent clients / one after another"}
    return [(names[key], results[key], target) for key, target in GOALS.items() if key in results]


def markdown(results: dict) -> str:
    meta = results["meta"]
    lines = [f"# GPU acceptance: {meta['device']}" + (" (dry run: tiny shapes on CPU)" if meta["dry_run"] else ""),
             "", f"dtype {meta['dtype']}, peak {meta['peak_tflops']:.3g} TFLOP/s ({meta['peak_source']}), "
             f"torch {meta['torch']}, commit {meta['commit']}, command `{meta['command']}`", "",
             "| section | measure | value | goal |", "|---|---|---|---|"]

    def row(section, measure, value, goal=""):
        lines.append(f"| {section} | {measure} | {value} | {goal} |")

    for r in results.get("train", {}).get("presets", []):
        for name in ("loop", "bare"):
            who = "train() loop" if name == "loop" else f"bare step ({r['bare']['attention_backend']})"
            row("train", f"{r['preset']} b={r['batch']} s={r['seq']} {r['precision']} {who}",
                f"{r[name]['tokens_per_s']:,.0f} tok/s, training-step MFU {100 * r[name]['mfu']:.1f} %")
        row("train", f"{r['preset']} loop / bare step", f"{r['loop_vs_bare']:.2f}x")
    if "attention" in results:
        a = results["attention"]
        row("attention", f"plain non-causal s={a['seq']} b={a['batch']} fwd / fwd+bwd",
            f"{a['full']['fwd_ms']:.2f} / {a['full']['fwdbwd_ms']:.2f} ms")
        for kernel, r in a["split"].items():
            bwd = "n/a" if r["fwdbwd_ms"] is None else f"{r['fwdbwd_ms']:.2f}"
            row("attention", f"split {kernel} fwd / fwd+bwd" + (" (auto's pick)" if kernel == a["best_split_kernel"] else ""),
                f"{r['fwd_ms']:.2f} / {bwd} ms")
        row("attention", f"fastest split kernel ({a['fastest_split_kernel']}) / plain, fwd+bwd",
            f"{a['fastest_split_vs_full_fwdbwd']:.2f}x")
    for r in results.get("longform", {}).get("runs", []):
        same = "identical" if r.get("identical") else f"DIFFERENT {r.get('first_difference')}"
        row("longform", f"{results['longform']['backend']} batch {r['batch']}: cached / reference / canvas tok/s "
            f"({same}, lengths {'ok' if r['lengths_ok'] else 'SHORT'})",
            " / ".join(f"{r[n]['tokens_per_s']:,.1f}" for n in ("cached", "uncached", "canvas")))
    for rule, r in results.get("eval", {}).get("rules", {}).items():
        row("eval", f"prefix cache speed-up, rule {rule}",
            f"{r['speedup']:.2f}x ({r['requests_per_s_off']:.1f} -> {r['requests_per_s_on']:.1f} req/s)")
    if "generation" in results:
        gen = results["generation"]
        shape = f"{gen['preset']} {gen['dtype']} b={gen['batch']} prompt {gen['prefix']}"
        row("generation", f"Mask-Predict T={gen['steps']} N={gen['new_tokens']}, {gen['mask_predict']}, {shape}",
            f"{gen['mask_predict_tokens_per_s']:,.1f} tok/s")
        row("generation", f"autoregressive ({gen['ar_baseline']}), {shape}", f"{gen['ar_tokens_per_s']:,.1f} tok/s")
    if "parity" in results:
        parity = results["parity"]
        for kernel, r in parity["kernels"].items():
            errs = ", ".join(f"{k[:-8]} {v:.1e}" for k, v in r.items() if k.endswith("_rel_err"))
            row("parity", f"{kernel} vs fp32 sdpa ({parity['dtype']}, rel. max error)",
                errs + ("" if "backward" not in r else "; backward not run"),
                f"<= {parity['tolerance']:.0e}: {'ok' if r['ok'] else 'FAILED'}")
    if "serve" in results:
        sv = results["serve"]
        for name in ("sequential", "concurrent"):
            who = "one after another" if name == "sequential" else f"{sv['clients']} concurrent clients"
            row("serve", f"{sv['requests']} requests, {sv['max_tokens']} tokens, {who}",
                f"{sv[name]['requests_per_s']:.1f} req/s, p50 {sv[name]['p50_s']:.3f} s, p99 {sv[name]['p99_s']:.3f} s")
    for r in results.get("throughput", []):
        for kind in ("like_for_like", "as_trained"):
            k = r[kind]
            for name in ("ours", "reference"):
                who = "ours" if name == "ours" else "EuroBertForMaskedLM"
                row("throughput", f"{r['preset']} b={r['batch']} s={r['seq']} {kind.replace('_', '-')} {who} "
                    f"({k['attention']}; {k['head']})",
                    f"{k[name]['tokens_per_s']:,.0f} tok/s, fwd+bwd MFU {100 * k[name]['mfu']:.1f} % of its own FLOPs")
    for name, value, target in goal_rows(results):
        row("goal", name, f"{value:.2f}", f">= {target:.2f}: {'met' if value >= target else 'not met'}")
    return "\n".join(lines) + "\n"


def finite_numbers(obj, path: str = "") -> list[str]:
    """Paths of numbers in `obj` that are not finite (NaN or inf)."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in finite_numbers(v, f"{path}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in finite_numbers(v, f"{path}[{i}]")]
    if isinstance(obj, float) and not math.isfinite(obj):
        return [path]
    return []


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench_gpu_out"), help="folder for the JSON and markdown")
    p.add_argument("--dry-run", action="store_true", help="every section on CPU with tiny shapes")
    p.add_argument("--sections", nargs="+", choices=SECTIONS + OPTIONAL_SECTIONS, default=list(SECTIONS),
                   help="the sections to run (always in the order above)")
    p.add_argument("--presets", nargs="+", default=["136m", "1p3b"])
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak bf16 TFLOP/s")
    p.add_argument("--steps", type=int, default=10, help="timed steps per model (train: per logging window)")
    p.add_argument("--reps", type=int, default=2, help="timed repetitions (longform, generation, eval)")
    p.add_argument("--longform-backend", choices=("megatron", "hf"), default="megatron",
                   help="long-form model: our BiGLMModel with the slot-pool cache (checked against the growing "
                        "cache), or transformers' EuroBERT with the growing cache (checked against uncached)")
    args = p.parse_args(argv)
    args.sections = [name for name in SECTIONS + OPTIONAL_SECTIONS if name in args.sections]
    if args.dry_run:
        args.presets, args.seq, args.batch = ["tiny"], 128, {"tiny": 2}
        args.steps, args.warmup, args.reps, args.attn_reps = min(args.steps, 2), 1, 1, 2
        args.train_steps, args.tokenizer_vocab, args.workers = 2, 512, 0
        args.heads, args.groups, args.head_dim = 4, 2, 32
        args.parity_seq, args.attn_seq, args.attn_batch = 160, 256, 2
        args.lf_prompt, args.lf_new, args.lf_block, args.lf_steps, args.lf_batches = 12, 24, 8, 2, [1, 2]
        args.gen_prefix, args.gen_batch = 32, 2
        args.eval_questions, args.eval_context, args.eval_choices, args.eval_rules = 2, 32, (2, 3), ["pll"]
        args.serve_requests, args.serve_clients, args.serve_max_tokens = 8, 4, 8
    else:
        args.seq, args.batch, args.warmup, args.attn_reps = 2048, {"136m": 16, "1p3b": 8}, 3, 20
        args.train_steps, args.tokenizer_vocab, args.workers = args.steps, 4096, 2
        args.heads, args.groups, args.head_dim = 32, 32, 64  # the 1.3B preset's attention
        args.parity_seq, args.attn_seq, args.attn_batch = 1000, 2048, 8
        args.lf_prompt, args.lf_new, args.lf_block, args.lf_steps, args.lf_batches = 128, 1024, 32, 8, [1, 8]
        args.gen_prefix, args.gen_batch = 512, 8
        args.eval_questions, args.eval_context, args.eval_choices, args.eval_rules = 12, 256, (4, 8), ["beam", "pll"]
        args.serve_requests, args.serve_clients, args.serve_max_tokens = 64, 16, 16  # `benchmarks serve`'s
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("error: no CUDA device; run with --dry-run to check the script on CPU", file=sys.stderr)
        return 2
    threads = torch.get_num_threads()
    if args.dry_run:
        torch.set_num_threads(1)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _write(args, results: dict) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / (JSON_NAME + ".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(args.out / JSON_NAME)


def _run(args, argv) -> int:
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(seed=0)
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    peak, peak_source = peak_flops(device, dtype, args.peak_tflops)
    command = "python -m benchmarks gpu " + " ".join(sys.argv[1:] if argv is None else argv)
    results = dict(meta=dict(device=device_name(device), dry_run=args.dry_run, dtype=str(dtype).replace("torch.", ""),
                             peak_tflops=peak / 1e12, peak_source=peak_source, torch=torch.__version__,
                             commit=_commit(), command=command, sections_done=[]))
    t_start = time.perf_counter()
    from benchmarks.gpu_train import train_section

    phases = {"train": lambda: train_section(args, device, dtype, peak),
              "attention": lambda: split_vs_full_attention(args, device, dtype),
              "longform": lambda: longform(args, device, dtype),
              "eval": lambda: eval_prefix_cache(args, device),
              "generation": lambda: mask_predict_vs_ar(args, device, dtype),
              "parity": lambda: attention_parity(args, device, dtype),
              "serve": lambda: serve_throughput(args),
              "throughput": lambda: [preset_throughput(p, args, device, dtype, peak) for p in args.presets]}
    for name in args.sections:
        t0 = time.perf_counter()
        init_single_process(seed=0)
        results[name] = phases[name]()
        results.update(summary(results))
        results["meta"]["sections_done"].append(name)
        results["meta"]["seconds"] = time.perf_counter() - t_start
        _write(args, results)
        print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", flush=True)
    results["goals"] = [dict(goal=g, value=v, target=t, met=v >= t) for g, v, t in goal_rows(results)]
    _write(args, results)
    bad = finite_numbers(results)
    table = markdown(results)
    (args.out / MD_NAME).write_text(table)
    print(table)
    print(f"wrote {args.out / JSON_NAME} and {args.out / MD_NAME}")
    if bad:
        print(f"error: non-finite results at {bad}", file=sys.stderr)
        return 1
    if "parity" in results and not all(r["ok"] for r in results["parity"]["kernels"].values()):
        print("error: a kernel is outside the parity tolerance", file=sys.stderr)
        return 1
    if results.get("longform_identical") is False:
        print("error: long-form cached tokens differ from the uncached reference's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
