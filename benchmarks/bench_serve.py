"""Serving throughput: the same requests sent by 16 concurrent clients vs one after another.

A random EuroBERT at the `tiny` preset with our BPE trained on the sample corpus (as
`bench_eval` builds it) is exported to an HF directory and served by a real `biglm-serve`
subprocess (torch on one thread). The requests are prompts cut from the corpus, each
`max_tokens` slots sampled at `--temperature` (0.8; 0 is greedy) with its own seed (T steps per block of
`block_size`). They are sent twice to the same server: one after another (one client), then by
`--clients` concurrent clients pulling from the same list. Throughput is requests per second of
wall time; latency is per request, as the client saw it. The two passes alternate `--reps`
times and the fastest of each is reported (other jobs on the machine slow both alike). The outputs of the two passes must be
equal token for token (each request is seeded on its own), or the benchmark fails.

    python -m benchmarks serve [--requests 64] [--clients 16] [--max-tokens 16] [--steps 8]
                               [--block-size 8] [--temperature 0.8] [--threads 1] [--reps 3]

Goal (CPU, tiny model): concurrent throughput >= 4x sequential.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GOAL = 4.0


def export_model(folder: Path) -> Path:
    from benchmarks.bench_eval import build_model, sample_tokenizer

    tokenizer, _ = sample_tokenizer(folder)
    model = build_model(tokenizer, "cpu")
    model.save_pretrained(folder / "hf")
    tokenizer.save_pretrained(folder / "hf")
    return folder / "hf"


def corpus_prompts(count: int) -> list[str]:
    from megatron_biglm.data import sample_corpus

    lines = []
    for path in sample_corpus.play_files():
        lines += [x.strip() for x in Path(path).read_text(encoding="utf-8").splitlines() if len(x.split()) >= 6]
        if len(lines) >= count:
            break
    return [" ".join(x.split()[:12]) for x in lines[:count]]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(args) -> dict:
    import requests

    from megatron_biglm.serving.metrics import parse_counters
    from megatron_biglm.serving.process import serve_process

    with tempfile.TemporaryDirectory() as tmp:
        model = export_model(Path(tmp))
        prompts = corpus_prompts(args.requests)
        bodies = [{"model": "bench", "prompt": p, "max_tokens": args.max_tokens, "temperature": args.temperature,
                   "seed": i, "steps": args.steps, "block_size": args.block_size}
                  for i, p in enumerate(prompts)]
        with serve_process(model, "--max-rows", str(4 * args.clients), name="bench",
                           threads=args.threads) as server:
            url = server.url + "/v1/completions"

            def send(body):
                start = time.perf_counter()
                r = requests.post(url, json=body, timeout=600)
                r.raise_for_status()
                return r.json()["choices"][0]["token_ids"], time.perf_counter() - start

            def block_steps():
                counts = parse_counters(requests.get(server.url + "/metrics", timeout=60).text)
                return counts["biglm_batch_rows_sum"], counts["biglm_batch_rows_count"]

            send(bodies[0])  # warm-up
            passes = {"sequential": [], "concurrent": []}
            concurrent_rows = concurrent_steps = 0.0
            for _ in range(args.reps):  # alternated, so load from elsewhere hits both alike
                t0 = time.perf_counter()
                sequential = [send(b) for b in bodies]
                passes["sequential"].append((time.perf_counter() - t0, sequential))
                rows0, steps0 = block_steps()
                t0 = time.perf_counter()
                with ThreadPoolExecutor(args.clients) as pool:
                    concurrent = list(pool.map(send, bodies))
                passes["concurrent"].append((time.perf_counter() - t0, concurrent))
                rows1, steps1 = block_steps()
                concurrent_rows, concurrent_steps = concurrent_rows + rows1 - rows0, concurrent_steps + steps1 - steps0
                if [ids for ids, _ in sequential] != [ids for ids, _ in concurrent]:
                    raise SystemExit("the concurrent outputs differ from the sequential ones")
    (sequential_s, sequential), (concurrent_s, concurrent) = (min(passes[k], key=lambda p: p[0])
                                                              for k in ("sequential", "concurrent"))

    def latencies(rows):
        values = [s for _, s in rows]
        return {"p50_s": statistics.median(values), "p99_s": _percentile(values, 0.99)}

    return {"requests": len(bodies), "clients": args.clients, "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "steps": args.steps, "block_size": args.block_size, "threads": args.threads,
            "sequential": {"seconds": sequential_s, "requests_per_s": len(bodies) / sequential_s,
                           **latencies(sequential)},
            "concurrent": {"seconds": concurrent_s, "requests_per_s": len(bodies) / concurrent_s,
                           **latencies(concurrent)},
            "ratio": sequential_s / concurrent_s, "same_outputs": True, "reps": args.reps,
            "all_seconds": {k: [round(t, 3) for t, _ in v] for k, v in passes.items()},
            # the server's block steps during the concurrent passes (the sequential ones run 1 row each)
            "concurrent_rows_per_block_step": concurrent_rows / concurrent_steps}


def markdown(r: dict) -> str:
    rows = ["| pass | wall s | requests/s | p50 s | p99 s |", "|---|---:|---:|---:|---:|"]
    for name in ("sequential", "concurrent"):
        x = r[name]
        label = "one after another" if name == "sequential" else f"{r['clients']} concurrent clients"
        rows.append(f"| {label} | {x['seconds']:.2f} | {x['requests_per_s']:.2f} | {x['p50_s']:.3f} "
                    f"| {x['p99_s']:.3f} |")
    rows.append(f"\nbest of {r['reps']} alternated passes; every pass in s: {r['all_seconds']}")
    rows.append(f"throughput ratio {r['ratio']:.2f}x (goal >= {GOAL:g}x); outputs identical: "
                f"{r['same_outputs']}; rows per block step in the concurrent passes "
                f"{r['concurrent_rows_per_block_step']:.2f}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--block-size", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    p.add_argument("--reps", type=int, default=3, help="alternated pairs of passes; the best of each counts")
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = p.parse_args(argv)
    result = run(args)
    print(markdown(result))
    if args.json:
        print(json.dumps(result, indent=2))
    return 0 if result["ratio"] >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
