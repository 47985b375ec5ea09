"""Long-form generation with the exact prefix cache, against recomputing and LLaDA's canvas.

    python -m benchmarks longform [--preset 136m | --model HF_DIR] [--prompt-tokens 128]
                                  [--new-tokens 1024] [--block 32] [--steps 8] [--batches 1 8]
                                  [--device cuda] [--out FILE.json]

Three decoders on the same model, prompts, blocks, steps per block and re-masking rule
(Mask-Predict's low-confidence re-masking, greedy):

  (a) cached    block-causal attention (finished blocks join the prefix and never see later
                blocks), the prompt's and finished blocks' K/V reused through the exact cache
                (`blocks="cached"`);
  (b) uncached  the same attention recomputed from the ids at every step (`blocks="cached"`,
                `use_cache=False`: a 4D block-causal mask). Its tokens must equal (a)'s: that is
                the claim that the cache is exact, checked here before any speed is reported;
  (c) canvas    LLaDA-style: the whole canvas (prompt and every slot, later blocks masked) is
                re-run at every step under full bidirectional attention (`blocks="canvas"`).

Speed, measured only after the tokens are checked (every output `--new-tokens` long, (a)'s
equal to (b)'s): generated tokens/s of each decoder at each batch size, the median of
`--reps` timed calls after a short warm-up, decoders interleaved within each repetition, and
the ratios (a)/(b) and (a)/(c).

Quality of (a) and (c) (with `--model`, a trained HF export; random weights give no meaningful
text): the NLL of the generated text scored with full context by the same model (8 passes,
each masking every 8th generated token, prompt as the prefix), distinct-2, and the rate of
repeated 4-grams (a 4-gram seen earlier in the same output). Prompts are held-out windows of
the sample corpus tokenized by the export's tokenizer; a model trained at fewer positions runs
at `1 + prompt + new` positions through RoPE (its config's limit is raised, nothing else).
Without `--model`, a random-weight EuroBERT of the preset's shape and random prompt ids: speed
only.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.text_metrics import distinct_2, full_context_nll, repeated_4gram_rate

DECODERS = ("cached", "uncached", "canvas")


def random_model(preset: str, positions: int, device, dtype):
    """(adapter, tokenizer, vocab): a random EuroBERT of the preset's shape, ids-level tokenizer."""
    from transformers import EuroBertConfig, EuroBertForMaskedLM

    from benchmarks.bench_generation import BOS, EOS, MASK, PAD, SPECIAL, IdsTokenizer
    from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
    from megatron_biglm.model.presets import load_preset

    p = load_preset(preset)
    torch.manual_seed(0)
    config = EuroBertConfig(
        vocab_size=p.vocab_size, hidden_size=p.hidden_size, intermediate_size=p.ffn_hidden_size,
        num_hidden_layers=p.num_layers, num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_query_groups, max_position_embeddings=positions,
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False, hidden_act="silu",
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, mask_token_id=MASK)
    model = EuroBertForMaskedLM(config).to(device, dtype).eval()
    return HFMaskedLMAdapter(model, SPECIAL, prefix_cache="on"), IdsTokenizer(), p.vocab_size


def random_megatron_model(preset: str, positions: int, device, dtype, cache_layout: str):
    """(adapter, tokenizer, vocab): our own BiGLMModel of the preset's shape, random weights,
    behind the megatron adapter with the given K/V cache layout ("pool" or "grow")."""
    from benchmarks.bench_generation import SPECIAL, IdsTokenizer
    from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter
    from megatron_biglm.model import load_preset, model_provider
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(seed=0)
    cfg = load_preset(preset, {"seq_length": max(positions, load_preset(preset).seq_length)})
    params_dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    model = model_provider(True, True, cfg, params_dtype=params_dtype).to(device)
    adapter = MegatronMaskedLMAdapter(model, SPECIAL, vocab_size=cfg.vocab_size, max_length=cfg.seq_length,
                                      cache_layout=cache_layout,
                                      step_graphs=cache_layout == "pool" and torch.device(device).type == "cuda")
    return adapter, IdsTokenizer(), cfg.vocab_size


def export_model(folder: Path, positions: int, device, dtype):
    """(adapter, tokenizer): a trained HF export, its position limit raised to `positions`."""
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    from megatron_biglm.inference import inference_token_ids
    from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter

    config = AutoConfig.from_pretrained(folder)
    trained_positions = int(config.max_position_embeddings)
    config.max_position_embeddings = max(trained_positions, positions)
    model = AutoModelForMaskedLM.from_pretrained(folder, config=config).to(device, dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    adapter = HFMaskedLMAdapter(model, inference_token_ids(tokenizer), prefix_cache="on")
    return adapter, tokenizer, trained_positions


def corpus_prompts(tokenizer, count: int, length: int) -> list[list[int]]:
    """The first `length` ids of the last `count` long-enough scenes of the sample corpus (the
    quickstart's validation split is the end of the corpus, so this is its held-out text)."""
    from megatron_biglm.data import sample_corpus

    prompts: list[list[int]] = []
    for doc in reversed(list(sample_corpus.iter_documents())):
        ids = tokenizer(doc["text"], add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            prompts.append(ids[:length])
            if len(prompts) == count:
                return prompts
    raise ValueError(f"the sample corpus holds fewer than {count} scenes of {length} tokens")


def generators(adapter, tokenizer):
    from megatron_biglm.generation import MaskPredictGenerator

    return {"cached": MaskPredictGenerator(adapter, tokenizer, use_cache=True),
            "uncached": MaskPredictGenerator(adapter, tokenizer, use_cache=False),
            "canvas": MaskPredictGenerator(adapter, tokenizer, use_cache=False)}


def run(args) -> dict:
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
    from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter

    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    positions = 1 + args.prompt_tokens + args.new_tokens
    if args.model:
        adapter, tokenizer, trained = export_model(Path(args.model), positions, device, dtype)
        prompts = corpus_prompts(tokenizer, max(args.batches), args.prompt_tokens)
        source = dict(model=str(args.model), trained_positions=trained, prompts="sample corpus, last plays")
    elif getattr(args, "backend", "hf") == "megatron":
        adapter, tokenizer, vocab = random_megatron_model(args.preset, positions, device, dtype, "pool")
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(4, vocab, (max(args.batches), args.prompt_tokens), generator=g).tolist()
        source = dict(model=f"random {args.preset} shape (our BiGLMModel)", prompts="random ids")
    else:
        adapter, tokenizer, vocab = random_model(args.preset, positions, device, dtype)
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(4, vocab, (max(args.batches), args.prompt_tokens), generator=g).tolist()
        source = dict(model=f"random {args.preset} shape", prompts="random ids")
    params = sum(p.numel() for p in adapter.model.parameters())
    gens = generators(adapter, tokenizer)
    if getattr(args, "backend", "hf") == "megatron":
        # our model has no uncached block-causal forward: the reference is the growing cache,
        # held exact to that forward by tests/inference/test_inference_prefix_cache.py
        reference = MaskPredictGenerator(MegatronMaskedLMAdapter(adapter.model, adapter.special, vocab_size=vocab,
                                                                 max_length=adapter.max_length, cache_layout="grow"),
                                         tokenizer, use_cache=True)
        gens["uncached"] = reference
        source["reference"] = "growing K/V cache (exact), not an uncached forward"
        source["cache"] = ("slot pool (megatron adapter, cache_layout=pool"
                           + (", steps replayed from CUDA graphs)" if adapter.step_graphs else ")"))
    base = dict(length=args.new_tokens, steps=args.steps, block_size=args.block)  # fixed length: no EOS cut
    configs = {"cached": GenerationConfig(**base, blocks="cached"),
               "uncached": GenerationConfig(**base, blocks="cached"),
               "canvas": GenerationConfig(**base, blocks="canvas")}
    warm = GenerationConfig(length=2 * args.block, steps=2, block_size=args.block)
    results = dict(meta=dict(device=str(device) if device.type == "cpu" else torch.cuda.get_device_name(device),
                             threads=torch.get_num_threads(), dtype=args.dtype, parameters=params,
                             prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, block=args.block,
                             steps_per_block=args.steps, torch=torch.__version__, **source),
                   runs=[])
    reps = getattr(args, "reps", 1)
    for batch in args.batches:
        batch_prompts = prompts[:batch]
        for name in args.decoders:  # warm-up: kernels, allocator, caches
            gens[name].generate_ids(batch_prompts[:1], warm.replace(blocks=configs[name].blocks), batch_size=1)
        row = dict(batch=batch)
        # the tokens first: every output at full length, and the cache's equal to the
        # uncached reference's, before any speed is measured or printed
        outputs = {name: [list(o.ids) for o in gens[name].generate_ids(batch_prompts, configs[name], batch_size=batch)]
                   for name in args.decoders}
        row["lengths_ok"] = all(len(ids) == args.new_tokens for outs in outputs.values() for ids in outs)
        if "cached" in outputs and "uncached" in outputs:
            diffs = [first_difference(a, b) for a, b in zip(outputs["cached"], outputs["uncached"])]
            row["identical"] = row["lengths_ok"] and all(d is None for d in diffs)
            row["first_difference"] = diffs
        seconds = {name: [] for name in args.decoders}
        for _ in range(reps):  # interleaved, so a load change hits every decoder alike
            for name in args.decoders:
                _sync(device)
                t0 = time.perf_counter()
                gens[name].generate_ids(batch_prompts, configs[name], batch_size=batch)
                _sync(device)
                seconds[name].append(time.perf_counter() - t0)
        for name in args.decoders:
            sec = statistics.median(seconds[name])
            row[name] = dict(seconds=sec, tokens_per_s=batch * args.new_tokens / sec, reps=reps)
        if "cached" in outputs and "uncached" in outputs:
            row["cached_vs_uncached"] = row["uncached"]["seconds"] / row["cached"]["seconds"]
        if "cached" in outputs and "canvas" in outputs:
            row["cached_vs_canvas"] = row["canvas"]["seconds"] / row["cached"]["seconds"]
        if row.get("identical", True):
            for name in args.decoders:
                print(f"batch {batch} {name}: {row[name]['seconds']:.2f} s, {row[name]['tokens_per_s']:.1f} tok/s",
                      flush=True)
        else:
            print(f"batch {batch}: the cached tokens differ from the uncached reference's (first difference "
                  f"{row['first_difference']}, lengths ok: {row['lengths_ok']}); speeds not printed", flush=True)
        if args.model:
            row["quality"] = {name: dict(nll=full_context_nll(adapter, batch_prompts, outs),
                                         distinct_2=distinct_2(outs), repeated_4grams=repeated_4gram_rate(outs))
                              for name, outs in outputs.items() if name != "uncached"}
        results["runs"].append(row)
    return results


def first_difference(a: list, b: list) -> int | None:
    """The first position where two id lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def markdown(results: dict) -> str:
    m = results["meta"]
    lines = [f"{m['device']} ({m['threads']} threads), {m['dtype']}, {m['model']} ({m['parameters']:,} parameters); "
             f"prompt {m['prompt_tokens']}, {m['new_tokens']} new tokens in blocks of {m['block']}, "
             f"T = {m['steps_per_block']} per block", "",
             "| batch | (a) cached tok/s | (b) uncached tok/s | (c) canvas tok/s | (a)/(b) | (a)/(c) | (a) == (b) |",
             "|---:|---:|---:|---:|---:|---:|---|"]

    def tps(row, name):
        return f"{row[name]['tokens_per_s']:.1f}" if name in row else "-"

    for row in results["runs"]:
        ratios = [f"{row[k]:.2f}x" if k in row else "-" for k in ("cached_vs_uncached", "cached_vs_canvas")]
        same = "-" if "identical" not in row else "identical" if row["identical"] else row["first_difference"]
        lines.append(f"| {row['batch']} | {tps(row, 'cached')} | {tps(row, 'uncached')} | {tps(row, 'canvas')} | "
                     f"{ratios[0]} | {ratios[1]} | {same} |")
    if any("quality" in row for row in results["runs"]):
        lines += ["", "| batch | decoder | NLL / token (full context) | distinct-2 | repeated 4-grams |",
                  "|---:|---|---:|---:|---:|"]
        for row in results["runs"]:
            for name, q in row.get("quality", {}).items():
                lines.append(f"| {row['batch']} | {name} | {q['nll']:.3f} | {q['distinct_2']:.3f} | "
                             f"{q['repeated_4grams']:.3f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="136m", help="random-weight model of this preset's shape (speed only)")
    p.add_argument("--model", default=None, help="a trained HF export: speed and quality")
    p.add_argument("--backend", choices=("hf", "megatron"), default="hf",
                   help="random-weight model: transformers' EuroBERT (growing cache) or our BiGLMModel with the "
                        "slot-pool cache, checked against the growing cache")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=1024)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--steps", type=int, default=8, help="T, Mask-Predict iterations per block")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--decoders", nargs="+", choices=DECODERS, default=list(DECODERS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--reps", type=int, default=3, help="timed runs per decoder (interleaved; median)")
    p.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    results = run(args)
    table = markdown(results)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if any(row.get("identical") is False or not row["lengths_ok"] for row in results["runs"]):
        print("error: the cached decoder's tokens differ from the uncached reference's, or an output is "
              "short", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
