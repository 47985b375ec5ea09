"""Attention memory and time vs sequence length, for each backend this machine has.

Runs BiGLM's core attention module (the code the model runs) on one layer's q/k/v with a
random split per sample, at s = 512, 2048, 8192:

  full   unmasked attention (variants mlm/no_attn): SDPA, or flash-attn on CUDA. The baseline.
  sdpa   SDPA with the dense [b,1,s,s] split mask
  local  megatron's unfused DotProductAttention with the dense mask (s <= 2048: at 8192 its
         fp32 score tensors alone need > 4 GB)
  flex   FlexAttention with the analytically built BlockMask (no compile), kernel compiled
         (also on CPU, where torch has no FlexAttention backward)
  flash  flash-attn varlen, two calls (CUDA with flash-attn only)

Memory is the peak above the pre-call level, separately for building the mask and for one
forward with it (the mask is built once per step and reused by every layer):
on CPU from the kernel's peak-RSS counter (reset through /proc/self/clear_refs; the benchmark
re-executes itself with glibc's mmap threshold at 64 KiB so freed blocks leave RSS), on CUDA
from torch's allocator. Linear growth shows as x4 from s=2048 to 8192, an s x s tensor as x16.
Times are medians; each row's time is also given relative to `full` at the same s.

For flex it also times the BlockMask build against torch's eager ``create_block_mask`` (the
dense-grid build the analytic one replaces) and prints the ratio.

    python -m benchmarks attention [--seqs 512 2048 8192] [--heads 4] [--groups 2] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import torch


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+)", fh.read()).group(1))


class PeakMemory:
    """Peak bytes allocated above the level at entry (CUDA allocator, or CPU peak RSS)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")  # reset VmHWM (peak RSS) to the current RSS
            self.base = _rss_kb("VmRSS") * 1024
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.base
        else:
            self.peak = _rss_kb("VmHWM") * 1024 - self.base


def make_core_attention(heads: int, groups: int, head_dim: int, dtype: torch.dtype = torch.float32):
    """BiGLM's core attention module for one layer of this shape; `dtype` sets megatron's
    precision flags (the `local` kernel's softmax runs in fp32 for bf16/fp16 inputs)."""
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_biglm.model.config import BiGLMModelConfig
    from megatron_biglm.model.core_attention import BiGLMCoreAttention

    cfg = BiGLMModelConfig(num_layers=1, hidden_size=heads * head_dim, num_attention_heads=heads,
                           num_query_groups=groups, ffn_hidden_size=64, vocab_size=128)
    core = BiGLMCoreAttention(cfg.to_transformer_config(params_dtype=dtype), layer_number=1,
                              attn_mask_type=AttnMaskType.arbitrary, attention_type="self")
    return core


def available_backends(cuda: bool) -> list[str]:
    from megatron_biglm.model.attention_params import flash_attn_available, torch_varlen_available

    if cuda:
        return (["full", "sdpa", "flex", "sdpa_split"] + (["varlen"] if torch_varlen_available() else [])
                + (["flash"] if flash_attn_available() else []))
    return ["full", "sdpa", "local", "flex", "sdpa_split"]


def measure(core, backend: str, s: int, args, device, dtype) -> dict:
    from megatron_biglm.model.attention_params import build_attention_params

    cuda = device.type == "cuda"
    g = torch.Generator().manual_seed(s)
    split = torch.randint(s // 5, s - s // 5, (args.batch,), generator=g)
    q = torch.randn(s, args.batch, args.heads, args.head_dim, generator=g).to(device, dtype)
    k = torch.randn(s, args.batch, args.groups, args.head_dim, generator=g).to(device, dtype)
    v = torch.randn(s, args.batch, args.groups, args.head_dim, generator=g).to(device, dtype)
    mask_backend = "sdpa" if backend == "full" else backend

    def build():
        if backend == "full":
            return build_attention_params(None, s, mask_backend)
        return build_attention_params(split, s, mask_backend, device=device, compile_flex=True)

    def forward(params):
        return core(q, k, v, None, packed_seq_params=params)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    with torch.no_grad():  # warm-up (compiles flex for this shape; grad mode is a compile guard)
        forward(build())
    with torch.no_grad(), PeakMemory(cuda) as mask_mem:
        params = build()
    with torch.no_grad(), PeakMemory(cuda) as mem:
        out = forward(params)
        del out
    del params
    reps = max(1, args.reps)
    mask_ms = _median_ms(build, args.mask_reps, sync)
    with torch.no_grad():
        params = build()
    with torch.no_grad():
        fwd_ms = timed_ms(lambda: forward(params), reps, cuda)
    row = dict(backend=backend, s=s, mask_mb=mask_mem.peak / 2**20, peak_mb=mem.peak / 2**20,
               fwd_ms=fwd_ms, mask_ms=mask_ms, reps=reps)
    if backend == "flex" and args.mask_baseline:
        row.update(_create_block_mask_baseline(split, s, device, cuda, sync))
    if backend == "flex" and not cuda:
        row["fwdbwd_ms"] = None  # torch has no FlexAttention backward on CPU
        return row
    for t in (q, k, v):
        t.requires_grad_(True)
    out = forward(params)
    out.float().sum().backward()  # warm-up
    row["fwdbwd_ms"] = timed_ms(lambda: forward(params).float().sum().backward(), reps, cuda)
    for t in (q, k, v):
        t.requires_grad_(False)
        t.grad = None
    return row


def timed_ms(fn, reps: int, cuda: bool) -> float:
    """Median milliseconds of `fn` over `reps` calls. On the device the calls run back to back,
    each between two CUDA events, with one sync after the last: every call starts behind the
    previous one's queue, as in a model, not on an idle device. On CPU: the wall clock."""
    times = []
    if cuda:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _median_ms(fn, reps: int, sync) -> float:
    times = []
    with torch.no_grad():
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _create_block_mask_baseline(split, s: int, device, cuda: bool, sync) -> dict:
    """Time/memory of torch's eager create_block_mask for the same BlockMask (the baseline the
    analytic build replaces: it evaluates the rule on the dense b x s x s grid)."""
    from megatron_biglm.model.attention_masks import flex_split_block_mask

    def create():
        return flex_split_block_mask(split, s, device=device, method="create")

    with torch.no_grad(), PeakMemory(cuda) as mem:
        create()
    return dict(create_mask_mb=mem.peak / 2**20, create_mask_ms=_median_ms(create, 3, sync))


def _growth(rows: dict, lo: int, hi: int, key: str) -> str:
    small, big = rows[lo][key], rows[hi][key]
    return f"{big / small:.1f}" if small > 0.05 else f"- ({small:.2f} -> {big:.2f} MB)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="attention memory/time per backend and length")
    parser.add_argument("--seqs", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=20, help="timed repetitions per kernel and length (median)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--local-max-seq", type=int, default=2048)
    parser.add_argument("--mask-reps", type=int, default=5, help="timing repetitions of the mask build")
    parser.add_argument("--no-mask-baseline", dest="mask_baseline", action="store_false",
                        help="skip timing torch's eager create_block_mask against the analytic flex build")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # glibc serves small blocks from a heap it keeps, hiding them from RSS; force every
        # block >= 64 KiB into its own mapping (returned on free) so peak RSS is exact.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
        argv = sys.argv[1:] if argv is None else list(argv)
        os.execve(sys.executable, [sys.executable, "-m", "benchmarks.bench_attention", *argv], env)
    torch.set_num_threads(args.threads)
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(seed=0)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    core = make_core_attention(args.heads, args.groups, args.head_dim).to(device)
    rows = []
    print(f"device {device} {dtype}, batch {args.batch}, {args.heads} heads / {args.groups} kv groups, "
          f"head dim {args.head_dim}, {args.threads} threads")
    print(f"{'backend':<7} {'s':>6} {'mask MB':>9} {'mask ms':>9} {'attn MB':>9} {'fwd ms':>9} {'fwd+bwd ms':>11} "
          f"{'fwd / full':>10}")
    for s in args.seqs:
        base = None
        for backend in available_backends(cuda):
            if backend == "local" and s > args.local_max_seq:
                continue
            row = measure(core, backend, s, args, device, dtype)
            base = row["fwd_ms"] if backend == "full" else base
            rows.append(row)
            fb = "n/a" if row["fwdbwd_ms"] is None else f"{row['fwdbwd_ms']:.1f}"
            print(f"{backend:<7} {s:>6} {row['mask_mb']:>9.1f} {row['mask_ms']:>9.2f} {row['peak_mb']:>9.1f} "
                  f"{row['fwd_ms']:>9.1f} {fb:>11} "
                  f"{row['fwd_ms'] / base:>9.2f}x", flush=True)
    flex_rows = [r for r in rows if r["backend"] == "flex" and "create_mask_ms" in r]
    if flex_rows:
        print("flex BlockMask build: analytic vs torch create_block_mask (eager, dense b x s x s grid):")
        for r in flex_rows:
            print(f"  s={r['s']:>6}: analytic {r['mask_ms']:.2f} ms / {r['mask_mb']:.1f} MB, create "
                  f"{r['create_mask_ms']:.1f} ms / {r['create_mask_mb']:.1f} MB: "
                  f"x{r['create_mask_ms'] / r['mask_ms']:.0f} faster")
    if len(args.seqs) >= 2:
        lo, hi = args.seqs[-2], args.seqs[-1]
        print(f"peak-memory growth from s={lo} to s={hi} (x{hi // lo} = linear, x{(hi // lo) ** 2} = s^2):")
        for backend in available_backends(cuda):
            got = {r["s"]: r for r in rows if r["backend"] == backend}
            if lo in got and hi in got:
                print(f"  {backend:<6} attention x{_growth(got, lo, hi, 'peak_mb')}, "
                      f"mask build x{_growth(got, lo, hi, 'mask_mb')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
