"""`/v1/embeddings`: texts to vectors, as the served model was trained (or exported) to embed.

Two kinds of model embed:
- a sentence-transformers directory (`to-st` exports, or any ST model; `modules.json`) is run by
  sentence-transformers itself, so its pooling, normalisation and prompts are the export's;
- a megatron checkpoint embeds through our own code (`finetune.retrieval.embed`: the tokenizer
  call sentence-transformers makes, `model/pooling.py`), with a contrastive run's pooling,
  normalisation, prefixes and length (the checkpoint's task-head record,
  what `to-st` writes into its export) and mean pooling, normalised, the default prefixes and
  the model's length for any other checkpoint. So the server's vectors equal the export's.

`input_type` (an extra request field) names the prompt put before each text: `query` or
`passage` (an ST export also knows its own names); without it the texts are embedded as given,
like `SentenceTransformer.encode(texts)`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

import torch

from megatron_biglm.checkpoint.task_head import EmbedderRecord
from megatron_biglm.config.trained_checkpoint import open_checkpoint
from megatron_biglm.finetune.retrieval.embed import EmbeddingOptions, embed_tokens, tokenize
from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter


class Embedder(Protocol):
    """Capability: texts -> fp32 vectors `[n, h]` on CPU; `prompts` are the known input types;
    `max_length` the tokens one input may take (its prompt and special tokens included), past
    which `embed` cuts it; `token_counts` what each input takes, uncut."""

    prompts: dict[str, str]
    max_length: int

    def embed(self, texts: list[str], input_type: str | None) -> torch.Tensor:
        ...

    def token_counts(self, texts: list[str], input_type: str | None) -> list[int]:
        ...


class SentenceTransformersEmbedder:
    def __init__(self, path, device: str):
        from sentence_transformers import SentenceTransformer  # lazy: optional (retrieval extra)

        self.model = SentenceTransformer(str(path), device=device)
        self.prompts = dict(self.model.prompts or {})
        self.max_length = int(self.model.max_seq_length)

    def token_counts(self, texts: list[str], input_type: str | None) -> list[int]:
        prefix = self.prompts[input_type] if input_type else ""
        return [len(ids) for ids in self.model.tokenizer([prefix + t for t in texts], verbose=False)["input_ids"]]

    def embed(self, texts: list[str], input_type: str | None) -> torch.Tensor:
        out = self.model.encode(list(texts), prompt_name=input_type, convert_to_tensor=True,
                                show_progress_bar=False)
        return out.float().cpu()


class CheckpointEmbedder:
    """Our embedding code over the served checkpoint's own model (one copy in memory)."""

    def __init__(self, path, model, tokenizer):
        checkpoint = open_checkpoint(path)
        record, _ = checkpoint.task_head()
        trained = record if isinstance(record, EmbedderRecord) else EmbedderRecord()
        self.model, self.tokenizer = model, tokenizer
        self.options = EmbeddingOptions(
            pooling=trained.pooling, normalize=trained.normalize, prompts=dict(trained.prompts),
            max_length=trained.max_length or int(checkpoint.model_config.seq_length))
        self.prompts = dict(self.options.prompts)
        self.max_length = int(self.options.max_length)

    def token_counts(self, texts: list[str], input_type: str | None) -> list[int]:
        prefix = self.prompts[input_type] if input_type else ""
        return [len(ids) for ids in self.tokenizer([prefix + t for t in texts], verbose=False)["input_ids"]]

    @torch.no_grad()
    def embed(self, texts: list[str], input_type: str | None) -> torch.Tensor:
        prefix = self.prompts[input_type] if input_type else ""
        ids, lengths = tokenize(self.tokenizer, [prefix + t for t in texts], self.options.max_length)
        return embed_tokens(self.model, ids, lengths, self.options).cpu()


def load_embedder(path, adapter, tokenizer) -> Embedder | None:
    """The embedder of the served `path` (its `adapter` and `tokenizer` as loaded for
    generation), or None when the model is neither an ST directory nor a megatron checkpoint
    (a plain HF export has no pooling to embed with)."""
    if (Path(path) / "modules.json").is_file():
        return SentenceTransformersEmbedder(path, str(adapter.device))
    if isinstance(adapter, MegatronMaskedLMAdapter):
        return CheckpointEmbedder(path, adapter.model, tokenizer)
    return None
