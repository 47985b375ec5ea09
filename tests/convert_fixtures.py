"""Fixtures and helpers for the checkpoint-conversion tests (tests/test_convert*.py).

A real BPE tokenizer trained on the Shakespeare corpus, random EuroBERT directories written by
transformers itself (the "checkpoint that was never ours"), and megatron forward helpers
that also work across pipeline stages (used inside torchrun workers, so no pytest here).
"""
from __future__ import annotations

from pathlib import Path

import torch

TOKENIZER_VOCAB = 400  # megatron pads it to 512: the padding rows are exercised both ways


def train_tokenizer(corpus_jsonl, out_dir: Path, vocab: int = TOKENIZER_VOCAB) -> Path:
    from megatron_biglm.data.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer([str(corpus_jsonl)], vocab, out_dir)


def random_eurobert_source(tokenizer_dir: Path, tmp_path_factory, seed: int) -> Path:
    """A native EuroBERT written by transformers with random weights, sized to the tokenizer."""
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    return write_random_eurobert(tmp_path_factory.mktemp("src") / "hf", vocab_size=vocab,
                                 tokenizer_dir=tokenizer_dir, seed=seed)


def write_random_eurobert(out_dir: Path, *, vocab_size: int, tokenizer_dir: Path | None = None,
                          seed: int = 0, dtype: torch.dtype = torch.float32, rope_theta: float = 50000.0,
                          hidden_size: int = 64, num_attention_heads: int = 4, num_key_value_heads: int = 2,
                          num_hidden_layers: int = 2, intermediate_size: int = 96, **config_overrides) -> Path:
    """Save a randomly initialised native `EuroBertForMaskedLM` (+ tokenizer) with `save_pretrained`.

    Weights are scaled so logits are O(1..10): a comparison of near-zero logits proves nothing.
    """
    from transformers import AutoTokenizer, EuroBertConfig, EuroBertForMaskedLM

    ids = {}
    if tokenizer_dir is not None:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        ids = {f"{r}_token_id": getattr(tok, f"{r}_token_id") for r in ("pad", "bos", "eos", "mask")}
    config = EuroBertConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads, hidden_act="silu", max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        attention_bias=False, mlp_bias=False,
        **{"tie_word_embeddings": True, **ids, **config_overrides})
    torch.manual_seed(seed)
    model = EuroBertForMaskedLM(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if param.dim() == 1 else 0.1 * noise)
    model.to(dtype).save_pretrained(str(out_dir))
    if tokenizer_dir is not None:
        AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out_dir))
    return Path(out_dir)


def hf_state(model_dir: Path) -> dict:
    """Every tensor in an HF directory's weight files (names as stored)."""
    from megatron_biglm.export import HFWeights

    weights = HFWeights(model_dir)
    return {name: weights[name] for name in weights}


def fixed_batch(vocab_size: int, batch: int = 3, seq: int = 40, seed: int = 7):
    """Token ids and per-sample prefix lengths, the same in every process."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab_size, (batch, seq), generator=gen)
    split = torch.randint(1, seq, (batch,), generator=gen)
    return ids, split


def megatron_logits(model, ids: torch.Tensor, split: torch.Tensor | None) -> torch.Tensor | None:
    """Full-vocabulary logits [b, s, V_padded] on the last pipeline stage (None elsewhere).

    With PP > 1 the first stage sends its hidden states to the next one (gloo p2p), as the
    pipeline schedule would; every TP rank gathers the vocabulary shards.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    with torch.no_grad():
        if ps.get_pipeline_model_parallel_world_size() == 1:
            return model(ids, split=split, runtime_gather_output=True)
        if ps.get_pipeline_model_parallel_world_size() != 2:
            raise ValueError("megatron_logits handles PP <= 2")
        if ps.is_pipeline_first_stage():
            hidden = model(ids, split=split)
            dist.send(hidden.contiguous(), ps.get_pipeline_model_parallel_next_rank())
            return None
        hidden = torch.empty(ids.shape[1], ids.shape[0], model.config.hidden_size)
        dist.recv(hidden, ps.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor([hidden])
        return model(ids, split=split, runtime_gather_output=True)


def build_megatron_model(model_config):
    """This rank's BiGLM chunk for the current parallel state (fp32, eval mode)."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    from megatron_biglm.model import model_provider

    tensor_parallel.model_parallel_cuda_manual_seed(0)
    return model_provider(ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage(),
                          config=model_config).eval()
