"""`/v1/embeddings`: texts to vectors, as the served model was trained (or exported) to embed.

Two kinds of model embed:
- a sentence-transformers directory (`to-st` exports, or any ST model; `modules.json`) is run by
  sentence-transformers itself, so its pooling, normalisation and prompts are the export's;
- a megatron checkpoint embeds through our own code (`finetune.retrieval.embed`: the tokenizer
  call sentence-transformers makes, `model/pooling.py`), with a contrastive run's pooling,
  normalisation, prefixes and length (`export.sentence_transformers_dir.contrastive_settings`,
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


class Embedder(Protocol):
    """Capability: texts -> fp32 vectors `[n, h]` on CPU; `prompts` are the known input types."""

    prompts: dict[str, str]

    def embed(self, texts: list[str], input_type: str | None) -> torch.Tensor:
        ...


class SentenceTransformersEmbedder:
    def __init__(self, path, device: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(path), device=device)
        self.prompts = dict(self.model.prompts or {})

    def embed(self, texts: list[str], input_type: str | None) -> torch.Tensor:
        out = self.model.encode(list(texts), prompt_name=input_type, convert_to_tensor=True,
                                show_progress_bar=False)
        return out.float().cpu()


class CheckpointEmbedder:
    def __init__(self, path, device: str):
        from megatron_biglm.export.sentence_transformers_dir import contrastive_settings
        from megatron_biglm.finetune.retrieval.embed import EmbeddingOptions
        from megatron_biglm.inference.loading import load_megatron_checkpoint

        loaded = load_megatron_checkpoint(path, device=device)
        trained = contrastive_settings(loaded.checkpoint.run_config.finetune)
        self.model, self.tokenizer = loaded.model, loaded.tokenizer
        self.options = EmbeddingOptions(
            pooling=trained.get("pooling", "mean"), normalize=trained.get("normalize", True),
            max_length=trained.get("max_length") or int(loaded.checkpoint.model_config.seq_length),
            **({"prompts": trained["prompts"]} if "prompts" in trained else {}))
        self.prompts = dict(self.options.prompts)

    @torch.no_grad()
    def embed(self, texts: list[str], input_type: str | None) -> torch.Tensor:
        from megatron_biglm.finetune.retrieval.embed import embed_tokens, tokenize

        prefix = self.prompts[input_type] if input_type else ""
        ids, lengths = tokenize(self.tokenizer, [prefix + t for t in texts], self.options.max_length)
        return embed_tokens(self.model, ids, lengths, self.options).cpu()


def load_embedder(path, device: str | None) -> Embedder | None:
    """The embedder of `path`, or None when the model is neither an ST directory nor a
    megatron checkpoint (a plain HF export has no pooling to embed with)."""
    from megatron_biglm.inference.loading import is_megatron_checkpoint, resolve_device

    device = resolve_device(device)
    if (Path(path) / "modules.json").is_file():
        return SentenceTransformersEmbedder(path, device)
    if is_megatron_checkpoint(path):
        return CheckpointEmbedder(path, device)
    return None
