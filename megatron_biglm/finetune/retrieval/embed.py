"""Texts -> embeddings with our model: tokenize as sentence-transformers does, pool, normalise.

One definition serves training (the recipe pools the same way), evaluation and the export
check: the exported sentence-transformers directory must give the same vectors, so the
tokenizer call here is the one ST's Transformer module makes (padding, truncation to
`max_length`, the tokenizer's own special tokens) and pooling follows `model/pooling.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from tqdm.auto import tqdm

from megatron_biglm.checkpoint.task_head import DEFAULT_PROMPTS
from megatron_biglm.export.sentence_transformers_dir import our_pooling
from megatron_biglm.model.pooling import pool_hidden


@dataclass
class EmbeddingOptions:
    """pooling: mean (default), first/cls or last; normalize: L2-normalise the vectors;
    prompts: the prefix put before a query and before a passage."""

    pooling: str = "mean"
    normalize: bool = True
    prompts: dict = field(default_factory=lambda: dict(DEFAULT_PROMPTS))
    max_length: int = 128

    def __post_init__(self):
        self.pooling = our_pooling(self.pooling)
        missing = {"query", "passage"} - set(self.prompts)
        if missing:
            raise ValueError(f"prompts need a 'query' and a 'passage' prefix; missing {sorted(missing)}")


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [b, s] right-padded, valid_lengths [b]) exactly as sentence-transformers
    tokenizes (padding=True, truncation, the tokenizer's special tokens)."""
    tokenizer.padding_side = "right"
    enc = tokenizer(list(texts), padding=True, truncation="longest_first", max_length=max_length,
                    return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"].sum(dim=1)


def pool(hidden: torch.Tensor, valid_lengths: torch.Tensor, options: EmbeddingOptions) -> torch.Tensor:
    """hidden [b, s, h] -> [b, h] fp32, pooled and (optionally) L2-normalised."""
    vectors = pool_hidden(hidden, valid_lengths, options.pooling).float()
    return torch.nn.functional.normalize(vectors, dim=-1) if options.normalize else vectors


def embed_tokens(model, input_ids: torch.Tensor, valid_lengths: torch.Tensor,
                 options: EmbeddingOptions) -> torch.Tensor:
    """One forward of BiGLMModel (full bidirectional attention, padding masked) -> embeddings."""
    device = next(model.parameters()).device
    # the lengths stay where the caller has them (the tokenizer's: the host); the model and the
    # pooling check them there and move what they need
    hidden = model(input_ids.to(device), split=None, valid_lengths=valid_lengths, return_hidden=True)
    return pool(hidden, valid_lengths, options)


@torch.no_grad()
def encode(model, tokenizer, texts: Sequence[str], options: EmbeddingOptions, *, side: str = "passage",
           batch_size: int = 32, progress: bool = False) -> torch.Tensor:
    """Embeddings [n, h] (fp32, CPU) of `texts`, each prefixed with `options.prompts[side]`."""
    prefix = options.prompts[side]
    out = []
    starts = range(0, len(texts), batch_size)
    for start in tqdm(starts, desc=f"encode {side}s", disable=not progress, unit="batch"):
        chunk = [prefix + t for t in texts[start:start + batch_size]]
        ids, lengths = tokenize(tokenizer, chunk, options.max_length)
        out.append(embed_tokens(model, ids, lengths, options).cpu())
    return torch.cat(out) if out else torch.zeros(0, 0)
