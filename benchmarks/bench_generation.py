"""Generation throughput (tokens/s), all in one run:

1. Mask-Predict (T=10, N=64, batch 8) with the exact prefix cache vs without it, at prefix 512;
2. block-wise decoding (block_size 16, blocks "refresh" and "cached") vs one block, plus the
   mean log-likelihood of each produced output under the single-split model (one forward per
   output: `[BOS] + prompt + N masks`, split = 1 + prompt length, the log-probability of every
   produced token at its masked slot, read through `adapter.logits`);
3. autoregressive decoding with a KV cache of a same-shape causal model (`LlamaForCausalLM`:
   same layers / hidden / heads / ffn / vocab, random weights, `generate(max_new_tokens=N,
   min_new_tokens=N, do_sample=False, use_cache=True)`, same batch and prompt length).

Models are random (fixed seed): a EuroBERT (`EuroBertForMaskedLM`, our HF export's layout)
behind `HFMaskedLMAdapter`; prompts are random ids, passed through an ids-level tokenizer
(a prompt is its ids written as decimal numbers), so no tokenizer training is timed. Every
figure is the median of `--reps` timed calls after one warm-up call per path; tokens/s counts
generated tokens (batch x N) over the wall time of the `generate` call.

    python -m benchmarks generation [--small] [--layers 4] [--hidden 256] [--prefix 512] [--reps 3]
                                    [--device cuda]

`--small` is a smoke run (2 layers x 128 hidden, prefix 128, 1 rep). `--profile` adds where
the time goes per step: Mask-Predict's prefix encode, its T slot forwards and the rest of each
iteration (sampling, re-masking, bookkeeping), against the autoregressive prefill, its N - 1
one-token forwards and `generate`'s own per-token work; then two bounds: the most Mask-Predict
can gain where compute is the cost (AR's total over Mask-Predict's prefix encode alone), and
the ratio of forward counts, which is what it tends to where every forward costs the same
launch-bound floor (a GPU at small batch).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from types import SimpleNamespace

import torch

PAD, BOS, EOS, MASK = 0, 1, 2, 3
SPECIAL = SimpleNamespace(bos_id=BOS, eos_id=EOS, pad_id=PAD, mask_id=MASK)


class IdsTokenizer:
    """A prompt's text is its ids as space-separated decimals; decode writes them back."""

    mask_token_id = MASK

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i < 4))


def shapes(args) -> dict:
    heads = max(1, args.hidden // 64)
    return dict(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads,
                max_position_embeddings=max(1024, 1 + args.prefix + 2 * args.new_tokens),
                tie_word_embeddings=True, attention_bias=False, mlp_bias=False, hidden_act="silu",
                pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)


def masked_lm(args):
    from transformers import EuroBertConfig, EuroBertForMaskedLM

    torch.manual_seed(0)
    return EuroBertForMaskedLM(EuroBertConfig(**shapes(args), mask_token_id=MASK)).eval()


def causal_lm(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**shapes(args))).eval()


def timed(fn, reps: int, device: torch.device) -> tuple[float, object]:
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def split_loglik(adapter, prompt_ids: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean log p(produced token) over all slots, all slots masked, split = 1 + prompt length."""
    dev = adapter.device
    rows = [[BOS] + p + [MASK] * len(o) for p, o in zip(prompt_ids, outputs)]
    width = max(map(len, rows))
    ids = torch.tensor([r + [PAD] * (width - len(r)) for r in rows], device=dev)
    lengths = torch.tensor([len(r) for r in rows], device=dev)
    split = torch.tensor([1 + len(p) for p in prompt_ids], device=dev)
    n = max(map(len, outputs))
    positions = split[:, None] + torch.arange(n, device=dev)[None]
    with torch.no_grad():
        logp = adapter.logits(ids, lengths, split, positions).float().log_softmax(-1)
    target = torch.tensor([o + [PAD] * (n - len(o)) for o in outputs], device=dev)
    picked = logp.gather(-1, target[..., None])[..., 0]
    real = torch.arange(n, device=dev)[None] < torch.tensor([len(o) for o in outputs], device=dev)[:, None]
    return float(picked[real].mean())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="smoke run: 2 x 128, prefix 128, 1 rep")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda (float32 either way)")
    p.add_argument("--profile", action="store_true", help="per-step time breakdown of Mask-Predict and AR")
    args = p.parse_args(argv)
    if args.small:
        args.layers, args.hidden, args.prefix, args.reps = 2, 128, 128, 1

    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
    from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter

    torch.set_grad_enabled(False)
    device = torch.device(args.device)
    mlm, clm = masked_lm(args).to(device), causal_lm(args).to(device)
    tok = IdsTokenizer()
    cached = MaskPredictGenerator(HFMaskedLMAdapter(mlm, SPECIAL, prefix_cache="on"), tok)
    uncached = MaskPredictGenerator(HFMaskedLMAdapter(mlm, SPECIAL, prefix_cache="off"), tok)
    assert cached.use_cache and not uncached.use_cache
    rng = random.Random(0)
    prompt_ids = [[rng.randrange(4, args.vocab) for _ in range(args.prefix)] for _ in range(args.batch)]
    prompts = [" ".join(map(str, ids)) for ids in prompt_ids]
    n, b = args.new_tokens, args.batch
    one = GenerationConfig(length=n, steps=args.steps)
    refresh = one.replace(block_size=args.block_size, blocks="refresh")
    blockc = one.replace(block_size=args.block_size, blocks="cached")
    ar_input = torch.tensor([[BOS] + ids for ids in prompt_ids], device=device)

    def mp(gen, config, texts=prompts):
        return gen.generate(texts, config, batch_size=b)

    def ar(inputs=ar_input):
        return clm.generate(input_ids=inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=n,
                            min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=PAD)

    # warm-up: every path once, on short prompts
    short = [" ".join(t.split()[:16]) for t in prompts]
    for gen, config in ((cached, one), (uncached, one), (cached, refresh), (cached, blockc)):
        mp(gen, config, short)
    ar(ar_input[:, :17])

    t0 = time.perf_counter()
    rows = {}
    for name, gen, config in (("mask-predict, prefix cache", cached, one),
                              ("mask-predict, no cache", uncached, one),
                              (f"block-wise B={args.block_size}, refresh", cached, refresh),
                              (f"block-wise B={args.block_size}, cached", cached, blockc)):
        secs, outs = timed(lambda: mp(gen, config), args.reps, device)
        assert all(len(o.ids) == n for o in outs)
        rows[name] = (secs, split_loglik(cached.adapter, prompt_ids, [o.ids for o in outs]))
    secs, out = timed(ar, args.reps, device)
    assert out.shape[1] == ar_input.shape[1] + n
    rows["autoregressive (Llama, KV cache)"] = (secs, None)
    total = time.perf_counter() - t0

    print(f"model: random EuroBERT / Llama, {args.layers} layers x {args.hidden} hidden, "
          f"{shapes(args)['num_attention_heads']} heads, ffn {3 * args.hidden}, vocab {args.vocab}; "
          f"batch {b}, prefix {args.prefix}, N={n}, T={args.steps}; threads {torch.get_num_threads()}; "
          f"{args.device}; median of {args.reps} (timed part {total:.0f} s)")
    print(f"{'path':36s} {'s/call':>8s} {'tokens/s':>9s}  split log-lik")
    tps = {}
    for name, (secs, ll) in rows.items():
        tps[name] = b * n / secs
        print(f"{name:36s} {secs:8.2f} {tps[name]:9.1f}  " + ("" if ll is None else f"{ll:.4f}"))
    c, u = tps["mask-predict, prefix cache"], tps["mask-predict, no cache"]
    r, k = (tps[f"block-wise B={args.block_size}, {m}"] for m in ("refresh", "cached"))
    a = tps["autoregressive (Llama, KV cache)"]
    print(f"prefix cache / no cache:            {c / u:.2f}x (goal >= 2: {'met' if c / u >= 2 else 'not met'})")
    print(f"block-wise refresh / one block:     {r / c:.2f}x")
    print(f"block-wise cached / one block:      {k / c:.2f}x")
    print(f"mask-predict (cached) / AR:         {c / a:.2f}x (goal >= 3: {'met' if c / a >= 3 else 'not met'})")
    if args.profile:
        profile(cached, one, prompts, clm, ar_input, n, device)
    return 0


def _clock(device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def profile(gen, config, prompts, clm, ar_input, n: int, device) -> dict:
    """Per-step times (ms) of one Mask-Predict call and one autoregressive decode, same batch."""
    spent = {"encode_prefix": [], "logits_with_prefix": []}
    adapter = gen.adapter
    for name in spent:  # instance attributes shadow the methods for this one call
        method = getattr(adapter, name)

        def timed_call(*a, _method=method, _name=name, **kw):
            t = _clock(device)
            out = _method(*a, **kw)
            spent[_name].append(_clock(device) - t)
            return out

        setattr(adapter, name, timed_call)
    try:
        t = _clock(device)
        gen.generate(prompts, config, batch_size=len(prompts))
        mp_total = _clock(device) - t
    finally:
        for name in spent:
            delattr(adapter, name)
    encode, forwards = sum(spent["encode_prefix"]), spent["logits_with_prefix"]
    mp_other = (mp_total - encode - sum(forwards)) / len(forwards)

    t = _clock(device)
    out = clm(input_ids=ar_input, attention_mask=torch.ones_like(ar_input), use_cache=True)
    prefill = _clock(device) - t
    past, token, steps = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True), []
    mask = torch.ones_like(ar_input)
    for _ in range(n - 1):
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        t = _clock(device)
        out = clm(input_ids=token, attention_mask=mask, past_key_values=past, use_cache=True)
        steps.append(_clock(device) - t)
        past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
    t = _clock(device)
    clm.generate(input_ids=ar_input, attention_mask=torch.ones_like(ar_input), max_new_tokens=n,
                 min_new_tokens=n, do_sample=False, use_cache=True, pad_token_id=PAD)
    ar_total = _clock(device) - t
    ar_other = (ar_total - prefill - sum(steps)) / (n - 1)
    row = dict(mp_total=mp_total, mp_encode=encode, mp_forwards=len(forwards),
               mp_forward=statistics.mean(forwards), mp_other=mp_other,
               ar_total=ar_total, ar_prefill=prefill, ar_steps=len(steps), ar_forward=statistics.mean(steps),
               ar_other=ar_other)
    ms = {k: v * 1e3 if isinstance(v, float) else v for k, v in row.items()}
    print("\nper-step profile (ms; one call each, same batch and prompts)")
    print(f"  mask-predict: total {ms['mp_total']:.1f} = prefix encode {ms['mp_encode']:.1f} + "
          f"{row['mp_forwards']} slot forwards x {ms['mp_forward']:.2f} + "
          f"{row['mp_forwards']} x {ms['mp_other']:.2f} other (sampling, re-masking, bookkeeping)")
    print(f"  autoregressive: total {ms['ar_total']:.1f} = prefill {ms['ar_prefill']:.1f} + "
          f"{row['ar_steps']} one-token forwards x {ms['ar_forward']:.2f} + "
          f"{row['ar_steps']} x {ms['ar_other']:.2f} other (generate's per-token work)")
    # Two bounds. Compute-bound (a CPU): even with free iterations, Mask-Predict cannot beat AR
    # by more than AR's total over its own prefix encode. Launch-bound (a GPU at small batch):
    # every forward costs about the same floor, so the ratio tends to AR's forwards over MP's.
    print(f"  compute-bound ceiling: MP / AR <= AR total / MP prefix encode = {ar_total / encode:.2f}x "
          f"(iterations free)")
    forwards_ratio = (1 + len(steps)) / (1 + len(forwards))
    print(f"  launch-bound estimate: AR's {1 + len(steps)} forwards / MP's {1 + len(forwards)} = "
          f"{forwards_ratio:.2f}x, less MP's per-iteration work ({ms['mp_other']:.1f} ms here)")
    row.update(compute_bound_ceiling=ar_total / encode, launch_bound_estimate=forwards_ratio)
    return row
