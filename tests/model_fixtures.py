"""Helpers for the model tests: a 1-process megatron setup, tiny models, batches, sharding.

Used in-process by tests/test_model*.py and tests/model/test_presets.py, and inside torchrun
workers by tests/model/test_parallel_model.py (so nothing here depends on pytest).
"""
from __future__ import annotations

from typing import Optional

import torch

#: A model small enough for many forward/backward passes on 2 cores, with GQA (4 heads, 2 groups).
TINY_TEST_SHAPE = dict(
    num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
    ffn_hidden_size=96, vocab_size=200, seq_length=128, make_vocab_size_divisible_by=8,
)


def init_megatron(tp: int = 1, pp: int = 1) -> None:
    """CPU shims, a default process group (1 process unless launched) and megatron's groups."""
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(tp, pp)


def tiny_config(**overrides):
    from megatron_biglm.model.config import BiGLMModelConfig

    return BiGLMModelConfig.from_dict({**TINY_TEST_SHAPE, "attention_backend": "sdpa", **overrides})


def build_model(cfg, seed: int = 0, pre_process: bool = True, post_process: bool = True, **tf):
    """A BiGLMModel for the current parallel state, initialised from `seed`."""
    from megatron.core import tensor_parallel

    from megatron_biglm.model.provider import model_provider

    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
    return model_provider(pre_process, post_process, cfg, **tf)


def random_batch(cfg, batch: int, seq: int, seed: int, mask_prob: float = 0.3) -> dict:
    """Tokens, a split in [1, seq-1] per sample, labels and a random loss mask."""
    g = torch.Generator().manual_seed(seed)
    return dict(
        input_ids=torch.randint(0, cfg.vocab_size, (batch, seq), generator=g),
        split=torch.randint(1, seq, (batch,), generator=g),
        labels=torch.randint(0, cfg.vocab_size, (batch, seq), generator=g),
        loss_mask=(torch.rand(batch, seq, generator=g) < mask_prob).long(),
    )


def random_full_state_dict(cfg, seed: int, std: float = 0.05) -> dict:
    """A full (TP=1, PP=1) state dict of random weights in the megatron layout."""
    from megatron_biglm.model.param_count import layer_param_shapes

    g = torch.Generator().manual_seed(seed)
    sd = {"embedding.word_embeddings.weight": torch.randn(cfg.padded_vocab_size, cfg.hidden_size, generator=g) * std}
    for i in range(cfg.num_layers):
        for name, shape in layer_param_shapes(cfg).items():
            if name.endswith("layernorm.weight"):
                value = 1.0 + 0.1 * torch.randn(shape, generator=g)
            else:
                value = torch.randn(shape, generator=g) * std
            sd[f"decoder.layers.{i}.{name}"] = value
    sd["decoder.final_layernorm.weight"] = 1.0 + 0.1 * torch.randn(cfg.hidden_size, generator=g)
    return sd


def shard_for_rank(full: dict, cfg, tp_rank: int, tp: int, pp_rank: int, pp: int) -> dict:
    """The slice of a full state dict one (tp_rank, pp_rank) holds, under its local names.

    Column-parallel weights split rows (QKV rows are grouped per query group, so contiguous
    chunks are whole groups; fc1 splits gate and up separately), row-parallel ones split
    columns, norms are replicated. Pipeline stages renumber their layers from 0; the last stage
    of a PP>1 model holds the tied output weight as `output_layer.weight`.
    """
    per_stage = cfg.num_layers // pp
    first, last = pp_rank == 0, pp_rank == pp - 1
    out = {}

    def rows(t):
        return t.chunk(tp, dim=0)[tp_rank]

    def cols(t):
        return t.chunk(tp, dim=1)[tp_rank]

    for name, value in full.items():
        if name == "embedding.word_embeddings.weight":
            if first:
                out[name] = rows(value)
            if last and pp > 1:
                out["output_layer.weight"] = rows(value)
        elif name == "decoder.final_layernorm.weight":
            if last:
                out[name] = value
        else:
            layer = int(name.split(".")[2])
            if layer // per_stage != pp_rank:
                continue
            local = name.replace(f"decoder.layers.{layer}.", f"decoder.layers.{layer % per_stage}.", 1)
            if name.endswith("linear_fc1.weight"):
                gate, up = value.chunk(2, dim=0)
                out[local] = torch.cat([rows(gate), rows(up)])
            elif name.endswith(("linear_qkv.weight",)):
                out[local] = rows(value)
            elif name.endswith(("linear_proj.weight", "linear_fc2.weight")):
                out[local] = cols(value)
            else:
                out[local] = value
    return out


def load_weights(model, weights: dict) -> None:
    """Copy `weights` into the model's parameters; every parameter must be covered."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(weights))
    extra = sorted(set(weights) - set(params))
    if missing or extra:
        raise KeyError(f"weights do not match the model: missing {missing}, unexpected {extra}")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])


def grads_by_name(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def mean_masked_loss(model, batch: dict, backend: Optional[str] = None) -> torch.Tensor:
    """Mean per-token loss over the loss mask, through the model's sparse prediction."""
    if backend is not None:
        model.attention_backend = backend
    losses = model(batch["input_ids"], split=batch["split"], labels=batch["labels"],
                   loss_mask=batch["loss_mask"])
    return (losses * batch["loss_mask"]).sum() / batch["loss_mask"].sum()


def spread_weights(model, std: float):
    """Redraw every matrix of `model` from N(0, std): wider than the init, so logits are
    O(1..10) and attention is not uniform (greedy choices are then not ties)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    return model


def core_attention_and_qkv(heads: int, groups: int, s: int, b: int, seed: int, head_dim: int = 16,
                           device="cpu", dtype=torch.float32):
    """One layer's `BiGLMCoreAttention` (heads x head_dim wide, `groups` K/V groups) and random
    q, k, v in megatron's `[s, b, heads, d]` layout, for the attention-kernel tests."""
    from megatron.core.transformer.enums import AttnMaskType

    from megatron_biglm.model.core_attention import BiGLMCoreAttention

    cfg = tiny_config(hidden_size=heads * head_dim, num_attention_heads=heads, num_query_groups=groups)
    core = BiGLMCoreAttention(cfg.to_transformer_config(), layer_number=1,
                              attn_mask_type=AttnMaskType.arbitrary, attention_type="self").to(device)
    g = torch.Generator().manual_seed(seed)
    shapes = [(s, b, heads, head_dim), (s, b, groups, head_dim), (s, b, groups, head_dim)]
    return core, [torch.randn(shape, generator=g).to(device, dtype) for shape in shapes]
