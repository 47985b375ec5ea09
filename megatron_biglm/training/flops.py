"""Model FLOPs per step and MFU, counting the split-mask attention at its real cost.

Per layer and token, the forward pass of a GQA SwiGLU block costs (multiply-add = 2 FLOPs)
    QKV projection   2·h·(n_q + 2·n_kv)·d
    output proj      2·n_q·d·h
    MLP              2·h·f·(3 if gated else 2)   (`BiGLMShape.gated_mlp`, from the config)
and the attention core costs 4·n_q·d per (query, key) pair it scores (QKᵀ and A·V).
A full bidirectional sequence of length L has L² pairs. BiGLM's split mask lets the s
prefix rows see only the s prefix keys while the L−s suffix rows see all L keys, so the
pairs computed by a kernel that skips masked blocks (FlexAttention, two flash calls) are

    s² + (L − s)·L      instead of L².

At the paper's α = 0.2, s ~ U(0.2L, 0.8L) and the mean is 0.78·L²: counting L² would
overstate attention FLOPs by ~28 % and inflate MFU. The output layer adds 2·h·V per
predicted token (the model projects only masked positions: sparse prediction).
Training is 3× the forward (backward = 2× forward); activation recompute is hardware
work, not model work, so it is not counted (the usual MFU definition).
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch

from megatron_biglm.model.shape import BiGLMShape

# Dense bf16 peak per device (TFLOP/s), for the default MFU denominator, by a part of the
# device's full name: the longest part that matches wins, so "NVIDIA H100 PCIe" is 756 (the
# PCIe card's lower clocks and power), not the SXM module's 989.
PEAK_TFLOPS_BF16 = {"A100": 312.0, "H100": 989.0, "H100 PCIe": 756.0, "H100 NVL": 835.0, "H200": 989.0,
                    "H800": 989.0, "A800": 312.0, "L40S": 362.0, "A10": 125.0}


def peak_tflops_for(device_name: str) -> tuple[str, float] | None:
    """(matched table key, dense bf16 TFLOP/s) for a device's full name, or None if unknown."""
    matches = [key for key in PEAK_TFLOPS_BF16 if key in device_name]
    if not matches:
        return None
    key = max(matches, key=len)
    return key, PEAK_TFLOPS_BF16[key]


def attended_pairs(seq_length: int, splits: Optional[Iterable[int]]) -> int:
    """(query, key) pairs scored for a batch: Σ s² + (L−s)·L per sample, which is L² for
    split 0 (full attention: the `mlm`/`no_attn` variants); `splits` None → one full sample."""
    L = seq_length
    if splits is None:
        return L * L
    return sum(s * s + (L - s) * L for s in (int(s) for s in splits))


def forward_flops(shape: BiGLMShape, tokens: int, pairs: int, predicted_tokens: Optional[int] = None) -> float:
    """Forward FLOPs for `tokens` tokens whose attention scores `pairs` (query, key) pairs.
    `predicted_tokens`: rows that go through the output layer (BiGLM's sparse prediction
    projects only masked positions); None = all tokens."""
    h, d, nq, nkv = shape.hidden_size, shape.head_dim, shape.num_attention_heads, shape.num_query_groups
    per_token_layer = (2 * h * (nq + 2 * nkv) * d + 2 * nq * d * h
                       + 2 * h * shape.ffn_hidden_size * (3 if shape.gated_mlp else 2))
    attention = 4 * nq * d * pairs
    dense = shape.num_layers * per_token_layer * tokens
    out_rows = tokens if predicted_tokens is None else predicted_tokens
    return float(dense + shape.num_layers * attention + 2 * h * shape.padded_vocab_size * out_rows)


def train_step_flops(shape: BiGLMShape, seq_length: int, num_samples: int, splits=None,
                     predicted_tokens: Optional[int] = None) -> float:
    """Model FLOPs of one training step over `num_samples` sequences (fwd + bwd = 3× fwd).
    `splits` (one per sample) gives the real attention cost; None counts full L² attention."""
    if splits is not None:
        splits = [int(s) for s in splits]
        if len(splits) != num_samples:
            raise ValueError(f"{len(splits)} splits for {num_samples} samples")
        pairs = attended_pairs(seq_length, splits)
    else:
        pairs = seq_length * seq_length * num_samples
    return 3.0 * forward_flops(shape, num_samples * seq_length, pairs, predicted_tokens)


def expected_pair_fraction(alpha: float) -> float:
    """E[(s² + (L−s)L)/L²] for s/L ~ U(α, 1−α): 1 − E[x] + E[x²] = 1 − 1/2 + E[x²]."""
    a, b = alpha, 1 - alpha
    ex2 = (b ** 3 - a ** 3) / (3 * (b - a))
    return 0.5 + ex2


def default_peak_tflops() -> Optional[float]:
    """Peak bf16 TFLOP/s of this device if it is a known GPU, else None (MFU not reported)."""
    try:
        if not torch.cuda.is_available():
            return None
        name = torch.cuda.get_device_name()
    except Exception:  # pragma: no cover - no driver
        return None
    found = peak_tflops_for(name)
    return found[1] if found else None


def mfu(flops_per_step: float, step_seconds: float, num_devices: int, peak_tflops: Optional[float]):
    """(TFLOP/s per device, MFU or None without a known peak)."""
    tflops = flops_per_step / max(step_seconds, 1e-12) / num_devices / 1e12
    return tflops, (tflops / peak_tflops if peak_tflops else None)
