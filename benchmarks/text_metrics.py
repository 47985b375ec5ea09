"""Measures of generated text shared by the generation benchmarks (longform, fidelity).

`full_context_nll` scores ids with a masked LM: each generated token is masked once (8 passes,
pass o masking tokens o, o + 8, ...), the prompt is the prefix (split) and every generated
token sees the others that are not masked. `distinct_2` and `repeated_4gram_rate` are
per-output rates averaged over outputs.
"""
from __future__ import annotations

import torch

NLL_STRIDE = 8


def full_context_nll(adapter, prompts: list[list[int]], outputs: list[list[int]]) -> float:
    """Mean NLL per generated token: pass o masks generated tokens o, o + 8, ...; the prompt is
    the prefix (split), every generated token sees all the others that are not masked."""
    dev, special = adapter.device, adapter.special
    bos, mask = int(special.bos_id), int(special.mask_id)
    total, count = 0.0, 0
    for prompt, out in zip(prompts, outputs):
        row = torch.tensor([bos] + prompt + out, device=dev)
        split = 1 + len(prompt)
        for offset in range(NLL_STRIDE):
            picked = torch.arange(split + offset, len(row), NLL_STRIDE, device=dev)
            if picked.numel() == 0:
                continue
            ids = row.clone()
            ids[picked] = mask
            with torch.no_grad():
                logp = adapter.logits(ids[None], torch.tensor([len(row)], device=dev),
                                      torch.tensor([split], device=dev), picked[None]).float().log_softmax(-1)
            total -= float(logp[0].gather(-1, row[picked][:, None]).sum())
            count += picked.numel()
    return total / count


def distinct_2(outputs: list[list[int]]) -> float:
    rates = [len(set(zip(o, o[1:]))) / max(1, len(o) - 1) for o in outputs]
    return sum(rates) / len(rates)


def repeated_4gram_rate(outputs: list[list[int]]) -> float:
    rates = []
    for o in outputs:
        grams = list(zip(o, o[1:], o[2:], o[3:]))
        seen, repeats = set(), 0
        for g in grams:
            repeats += g in seen
            seen.add(g)
        rates.append(repeats / max(1, len(grams)))
    return sum(rates) / len(rates)
