"""The one-command GPU acceptance run: every section budgeted, guarded and saved as it goes.

    python -m benchmarks gpu --out DIR [--sections NAME ...] [--budget-s SECONDS | NAME=SECONDS ...]
                             [--resume] [--peak-tflops X] [--inject-failure SECTION[:hang]]
    python -m benchmarks gpu --dry-run --out DIR   # every section on CPU, tiny shapes (CI runs it)

Sections, in the order a user pays for them (gpu_sections.py; `--sections` picks some, the
order stays):

  attention   one layer's split attention vs plain non-causal attention at s = 2048, the 1.3B
              preset's heads, batch 8, fwd and fwd+bwd: repetitions back to back, each between
              two CUDA events, the median of >= 20 (`bench_attention.timed_ms`).
  train       the 136M preset: the real `train()` against its bare twin, the same builders,
              optimizer (megatron's, fp32 main weights and gradient buffer), train_step, fresh
              batches from the real objective and micro-batches (gpu_train.py); median step
              over >= 20 steps after warm-up on each side, recompilations in the timed steps,
              the loop's step decomposed into data / forward+backward / optimizer / its own.
  mfu         the 1.3B preset through the real `train()`: its training-step MFU.
  longform    1,024 tokens in blocks of 32 after a 128-token prompt, 136M shape, at batch 1
              and 8: the exact cache vs its reference vs LLaDA's canvas re-run
              (`bench_longform.run`; identity and lengths checked before any speed).
  eval        zero-shot scoring with eval's prefix cache on vs off on the 136M preset
              (`bench_eval`): the HF export and its megatron checkpoint with the slot pool,
              median of the alternated repetitions.
  generation  Mask-Predict (T=10, N=64) with the slot-pool cache vs a same-shape Llama at its
              best (HF static cache, forward compiled with `reduce-overhead`).
  serve       a real `biglm-serve` subprocess, the same sampled requests one after another and
              by 16 concurrent clients (`bench_serve.run`).
  parity, throughput   only when named: bf16 split kernels against fp32 sdpa; fwd+bwd of our
              model against `EuroBertForMaskedLM` holding the same weights.

Each section runs under its own time budget and guard (gpu_guard.py): one that raises, overruns
or lacks an optional package (`skipped: <package> not installed`) is recorded under
`sections.<name>` with its error and elapsed time, and the next one runs. The JSON
(gpu_results.py) is rewritten atomically after every row; `sections.<name>` also holds the
section's compile counts (graphs, recompiles, graph_breaks). `--resume` keeps the sections a
previous call finished in `DIR` and runs the rest. `gpu_acceptance.md` and the goals table
(gpu_report.py) are written from whatever exists; the exit status is 0 when at least one
section produced figures and none of them is wrong (non-finite, a kernel outside parity, a
long-form output that differs from its reference). `--inject-failure SECTION[:hang]` makes a
section raise (or hang past its budget) to check all of this on any machine.

Peak bf16 FLOP/s comes from `training.flops.peak_tflops_for` by the device's full name (H100
SXM and H200: 989 TFLOP/s dense), `--peak-tflops` overrides it; on a device in neither (the
CPU of a dry run) a large matmul is timed in the same run and used as the peak.

`--dry-run` runs every section with the same code on CPU with tiny shapes (the `tiny` preset
at seq 128 stands in for both presets, fp32, one torch thread): it checks the script, not the
hardware. Its goals are printed but mean nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks import gpu_compile_counts, gpu_sections
from benchmarks.gpu_guard import run_guarded
from benchmarks.gpu_report import GOALS, MD_NAME, finite_numbers, goal_rows, markdown, summary  # noqa: F401
from benchmarks.gpu_results import JSON_NAME, Results  # noqa: F401 - JSON_NAME: where the run writes

SECTIONS = gpu_sections.DEFAULT
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
def eval_prefix_cache(args, device: torch.device, dtype: torch.dtype) -> dict:
    """Zero-shot scoring requests/s with eval's prefix reuse off and on (same requests, median
    of the alternated repetitions), for the HF export of a random model of the `eval_preset`
    shape and its megatron checkpoint (both through the one inference loader)."""
    from benchmarks.bench_eval import (build_model, build_requests, eval_lms, megatron_checkpoint,
                                       sample_tokenizer, time_rule)

    rules = {}
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer, corpus = sample_tokenizer(Path(tmp), max_plays=1)
        pairs = build_requests(tokenizer, corpus, args.eval_questions, args.eval_context, *args.eval_choices)
        model = build_model(tokenizer, str(device), args.eval_preset, dtype)
        checkpoint = megatron_checkpoint(model, tokenizer, Path(tmp))
        sources = {"hf": ("hf", model, "grow"), "megatron(pool)": ("megatron", checkpoint, "pool")}
        for rule in args.eval_rules:
            for name, (backend, source, layout) in sources.items():
                lms = eval_lms(backend, source, tokenizer, rule, 16, str(device), cache_layout=layout)
                median, scores, passes = time_rule(lms, pairs, args.reps)
                rules[f"{name}:{rule}"] = dict(
                    passes_per_request=passes, requests_per_s_off=len(pairs) / median[False],
                    requests_per_s_on=len(pairs) / median[True], speedup=median[False] / median[True],
                    max_score_diff=max(abs(a - b) for a, b in zip(scores[False], scores[True])))
    return dict(preset=args.eval_preset, dtype=str(dtype).replace("torch.", ""), reps=args.reps,
                requests=len(pairs), context_tokens=args.eval_context, rules=rules,
                runs="both sides: the same requests through the same lm-eval model, prefix cache off / on")


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


# ------------------------------------------------------------------ the run
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("bench_gpu_out"), help="folder for the JSON and markdown")
    p.add_argument("--dry-run", action="store_true", help="every section on CPU with tiny shapes")
    p.add_argument("--sections", nargs="+", choices=gpu_sections.ORDER, default=list(SECTIONS),
                   help="the sections to run (always in the order above)")
    p.add_argument("--budget-s", nargs="+", action="extend", default=[], metavar="SECONDS|NAME=SECONDS",
                   help="a total for the sections (their budgets scaled to it) and/or one section's budget")
    p.add_argument("--resume", action="store_true",
                   help="keep the sections a previous call finished in --out; run the others")
    p.add_argument("--inject-failure", action="append", default=[], metavar="SECTION[:hang]",
                   help="make SECTION raise (or, with :hang, run past its budget): checks the guard")
    p.add_argument("--presets", nargs="+", default=["136m", "1p3b"],
                   help="the first: train (loop vs bare), longform, eval, generation; the last: mfu")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's peak bf16 TFLOP/s")
    p.add_argument("--steps", type=int, default=20, help="timed steps per side after warm-up (train, mfu)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions (longform, generation, eval, serve)")
    p.add_argument("--longform-backend", choices=("megatron", "hf"), default="megatron",
                   help="long-form model: our BiGLMModel with the slot-pool cache (checked against the growing "
                        "cache), or transformers' EuroBERT with the growing cache (checked against uncached)")
    args = p.parse_args(argv)
    args.sections = [name for name in gpu_sections.ORDER if name in args.sections]
    try:
        gpu_sections.budgets(args.sections, args.budget_s, args.dry_run)  # refuses a bad --budget-s here
        args.inject = gpu_sections.parse_injection(args.inject_failure)
    except ValueError as exc:
        p.error(str(exc))
    if args.dry_run:
        args.presets, args.seq, args.batch, args.num_micro = ["tiny"], 128, {"tiny": 2}, 2
        args.warmup_steps, args.timed_steps, args.phase_steps = 2, min(args.steps, 3), 2
        args.steps, args.warmup, args.reps, args.attn_reps = min(args.steps, 2), 1, 1, 2
        args.tokenizer_vocab, args.workers = 512, 0
        args.heads, args.groups, args.head_dim = 4, 2, 32
        args.parity_seq, args.attn_seq, args.attn_batch = 160, 256, 2
        args.lf_prompt, args.lf_new, args.lf_block, args.lf_steps, args.lf_batches = 12, 24, 8, 2, [1, 2]
        args.gen_prefix, args.gen_batch = 32, 2
        args.eval_preset, args.eval_questions, args.eval_context, args.eval_choices = "tiny", 2, 32, (2, 3)
        args.eval_rules = ["pll"]
        args.serve_requests, args.serve_clients, args.serve_max_tokens = 8, 4, 8
    else:
        args.seq, args.batch, args.num_micro = 2048, {"136m": 8, "1p3b": 4}, 2
        args.warmup_steps, args.timed_steps, args.phase_steps = 5, max(args.steps, 20), 5
        args.warmup, args.attn_reps = 3, 20
        args.tokenizer_vocab, args.workers = 4096, 2
        args.heads, args.groups, args.head_dim = 32, 32, 64  # the 1.3B preset's attention
        args.parity_seq, args.attn_seq, args.attn_batch = 1000, 2048, 8
        args.lf_prompt, args.lf_new, args.lf_block, args.lf_steps, args.lf_batches = 128, 1024, 32, 8, [1, 8]
        args.gen_prefix, args.gen_batch = 512, 8
        args.eval_preset, args.eval_questions, args.eval_context, args.eval_choices = args.presets[0], 12, 256, (4, 8)
        args.eval_rules = ["beam", "pll"]
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


def _injected(how: str, section: str, budget_s: float):
    """The failure `--inject-failure` asked for, in place of the section."""
    def fail():
        if how == "hang":
            deadline = time.monotonic() + budget_s + 3600
            while time.monotonic() < deadline:
                time.sleep(0.05)
        raise RuntimeError(f"injected failure in section {section} (--inject-failure)")
    return fail


def _phases(args, results: Results, device, dtype, peak: float) -> dict:
    from benchmarks.gpu_train import loop_vs_bare

    def mfu():
        row = loop_vs_bare(args, results, "mfu", args.presets[-1], device, dtype, peak, bare=False)
        return dict(row, train_step_mfu=row["loop"]["mfu"])

    return {"attention": lambda: split_vs_full_attention(args, device, dtype),
            "train": lambda: loop_vs_bare(args, results, "train", args.presets[0], device, dtype, peak, bare=True),
            "mfu": mfu,
            "longform": lambda: longform(args, device, dtype),
            "eval": lambda: eval_prefix_cache(args, device, dtype),
            "generation": lambda: mask_predict_vs_ar(args, device, dtype),
            "serve": lambda: serve_throughput(args),
            "parity": lambda: attention_parity(args, device, dtype),
            "throughput": lambda: dict(presets=[preset_throughput(p, args, device, dtype, peak) for p in args.presets])}


def _problems(results: dict) -> list[str]:
    """Figures that are wrong, not missing: they fail the run."""
    out = []
    if bad := finite_numbers({k: v for k, v in results.items() if k != "sections"}):
        out.append(f"non-finite results at {bad}")
    if "parity" in results.get("sections", {}) and not all(r["ok"] for r in results.get("parity", {}).get(
            "kernels", {}).values()):
        out.append("a kernel is outside the parity tolerance")
    if results.get("longform_identical") is False:
        out.append("long-form cached tokens differ from the uncached reference's")
    return out


def _run(args, argv) -> int:
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(seed=0)
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    peak, peak_source = peak_flops(device, dtype, args.peak_tflops)
    command = "python -m benchmarks gpu " + " ".join(sys.argv[1:] if argv is None else argv)
    previous = Results.load(args.out) if args.resume else None
    results = Results(args.out, dict(device=device_name(device), dry_run=args.dry_run,
                                     dtype=str(dtype).replace("torch.", ""), peak_tflops=peak / 1e12,
                                     peak_source=peak_source, torch=torch.__version__, commit=_commit(),
                                     command=command), previous)
    results.save()
    phases = _phases(args, results, device, dtype, peak)
    t_start = time.perf_counter()
    kept = [name for name in args.sections if args.resume and results.produced(name)]
    budgets = gpu_sections.budgets([n for n in args.sections if n not in kept], args.budget_s, args.dry_run)
    for name in args.sections:
        if name in kept:
            print(f"[{name}] kept from the previous call (--resume)", flush=True)
            continue
        section, budget = gpu_sections.BY_NAME[name], budgets[name]
        results.data.pop(name, None)
        init_single_process(seed=0)
        fn = _injected(args.inject[name], name, budget) if name in args.inject else phases[name]
        print(f"[{name}] {section.what} (budget {budget:.0f} s)", flush=True)
        outcome = run_guarded(fn, budget_s=budget, requires=section.requires, counts=gpu_compile_counts)
        results.finish(name, outcome.figures, outcome.record)
        for key in section.headlines:
            results.data.pop(key, None)
        results.data.update(summary(results.data))
        results.data["meta"]["seconds"] = time.perf_counter() - t_start
        results.save()
        rec = outcome.record
        error = f": {rec['error']}" if rec.get("error") else ""
        print(f"[{name}] {rec['status']} in {rec['elapsed_s']:.1f} s{error}", flush=True)
    results.data["goals"] = [dict(goal=g, key=k, value=v, target=t, met=v >= t)
                             for k, g, v, t in goal_rows(results.data)]
    results.save()
    table = markdown(results.data)
    (args.out / MD_NAME).write_text(table)
    print(table)
    print(f"wrote {results.path} and {args.out / MD_NAME}")
    produced = [n for n, r in results.data["sections"].items() if r["status"] == "ok"]
    if not produced:
        print("error: no section produced figures", file=sys.stderr)
        return 1
    problems = _problems(results.data)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
