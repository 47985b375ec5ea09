"""Forward+backward of the tiny preset: our megatron-core model vs the plain-PyTorch reference.

The reference is the project's one plain-PyTorch BiGLM, transformers' `EuroBertForMaskedLM`
as exported by `megatron_biglm.export`, loaded with *our model's* weights through
`export.weight_mapping.megatron_to_hf`; the two must agree on the loss before anything is
timed. Both use SDPA with the same dense split mask. Two comparisons:

  full-logits  both project every position to the vocabulary, then take the masked loss:
               the like-for-like measure of megatron-core's overhead (goal <= 1.25x)
  as-trained   ours with sparse prediction (vocabulary projection on masked rows only) vs
               the reference's full logits: what a training step costs each

Timings interleave the two models step by step (the machine is shared) and report medians.

    python -m benchmarks model [--batch 8] [--seq 256] [--steps 10] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def build_pair(batch: int, seq: int, seed: int = 0, *, preset: str = "tiny", backend: str = "sdpa",
               device: "torch.device | str" = "cpu", dtype: torch.dtype = torch.float32):
    """(model config, our model, the EuroBERT reference holding our weights, a random batch).

    `preset` with `seq_length` = `seq`; our model uses attention `backend` (`auto`: the best
    split kernel of this device); both models and the batch are on `device` in `dtype`.
    """
    from megatron_biglm.export.hf_config import eurobert_config, shape_from_biglm_config
    from megatron_biglm.export.weight_mapping import megatron_to_hf
    from megatron_biglm.model import load_preset, model_provider
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(seed=seed)
    cfg = load_preset(preset, {"attention_backend": backend, "seq_length": seq})
    params_dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
    ours = model_provider(True, True, cfg, params_dtype=params_dtype).to(device)
    from transformers import EuroBertForMaskedLM

    hf_cfg = eurobert_config(
        shape_from_biglm_config(cfg), rope_theta=cfg.rotary_base, rms_norm_eps=cfg.norm_epsilon,
        max_position_embeddings=cfg.seq_length, mask_token_id=3,
    )
    hf_cfg._attn_implementation = "sdpa"
    with torch.device(device):  # initialised where it runs (a 1.3B model inits slowly on CPU)
        ref = EuroBertForMaskedLM(hf_cfg).to(dtype)
    weights = dict(megatron_to_hf(ours.state_dict(), shape_from_biglm_config(cfg)))
    missing, unexpected = ref.load_state_dict(weights, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embedding
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")
    g = torch.Generator().manual_seed(seed)
    data = dict(
        input_ids=torch.randint(0, cfg.vocab_size, (batch, seq), generator=g),
        split=torch.randint(seq // 5, seq - seq // 5, (batch,), generator=g),
        labels=torch.randint(0, cfg.vocab_size, (batch, seq), generator=g),
        loss_mask=(torch.rand(batch, seq, generator=g) < 0.3).long(),
    )
    return cfg, ours, ref, {k: v.to(device) for k, v in data.items()}


def _masked_mean(logits, data):
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                data["labels"].reshape(-1), reduction="none")
    mask = data["loss_mask"].reshape(-1).float()
    return (per_token * mask).sum() / mask.sum()


def step_ours(model, data, sparse: bool):
    if sparse:
        losses = model(data["input_ids"], split=data["split"], labels=data["labels"],
                       loss_mask=data["loss_mask"])
        loss = (losses * data["loss_mask"]).sum() / data["loss_mask"].sum()
    else:
        loss = _masked_mean(model(data["input_ids"], split=data["split"]), data)
    loss.backward()
    return loss.detach()


def step_ref(model, data, vocab_size: int):
    from megatron_biglm.export.split_attention import forward_with_split

    logits = forward_with_split(model, data["input_ids"], data["split"]).logits
    loss = _masked_mean(logits[..., :vocab_size], data)
    loss.backward()
    return loss.detach()


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="tiny preset fwd+bwd: megatron-core vs plain PyTorch")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg, ours, ref, data = build_pair(args.batch, args.seq)

    loss_ours = step_ours(ours, data, sparse=True)
    loss_full = step_ours(ours, data, sparse=False)
    loss_ref = step_ref(ref, data, cfg.vocab_size)
    diff = max(abs(loss_ours - loss_ref).item(), abs(loss_full - loss_ref).item())
    print(f"loss: ours {loss_ours.item():.6f} (sparse), {loss_full.item():.6f} (full logits); "
          f"reference {loss_ref.item():.6f}; max |diff| {diff:.2e}")
    if diff > 1e-4:
        print("error: the models disagree; timings would compare different computations", file=sys.stderr)
        return 1

    times = {"ours full-logits": [], "ours sparse": [], "reference": []}
    for _ in range(2):  # warm-up
        step_ours(ours, data, False), step_ours(ours, data, True), step_ref(ref, data, cfg.vocab_size)
    for _ in range(args.steps):
        ours.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        times["ours full-logits"].append(_time(lambda: step_ours(ours, data, False)))
        times["reference"].append(_time(lambda: step_ref(ref, data, cfg.vocab_size)))
        times["ours sparse"].append(_time(lambda: step_ours(ours, data, True)))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    tokens = args.batch * args.seq
    print(f"tiny preset ({sum(p.numel() for p in ours.parameters()):,} params), batch {args.batch} x "
          f"seq {args.seq}, {args.threads} threads, median of {args.steps} fwd+bwd steps:")
    for name, ms in med.items():
        print(f"  {name:<18s} {ms:8.1f} ms   {tokens / ms * 1e3:9.0f} tok/s")
    print(f"ratio full-logits ours/reference: {med['ours full-logits'] / med['reference']:.3f}  (goal <= 1.25)")
    print(f"ratio as-trained  ours/reference: {med['ours sparse'] / med['reference']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
