"""The two ways a model is evaluated: our checkpoint through our embedding code, or a
sentence-transformers directory (the `to-st` export, or any ST model on disk) through ST.

Both expose `encode_queries(texts)` / `encode_passages(texts)` -> fp32 [n, h] and an
`identity` string (path + weights mtime) that keys the corpus-embedding cache.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from megatron_biglm.inference.loading import is_megatron_checkpoint, load_megatron_checkpoint

from .embed import EmbeddingOptions, encode


def _identity(path) -> str:
    path = Path(path).resolve()
    stamps = sorted((str(p.relative_to(path)), p.stat().st_mtime_ns, p.stat().st_size)
                    for p in path.rglob("*") if p.is_file() and p.suffix in {".safetensors", ".pt", ".bin", ".json"})
    return f"{path}|{stamps}"


class OurEncoder:
    """A BiGLMModel (in memory) + tokenizer, embedding with `EmbeddingOptions`."""

    def __init__(self, model, tokenizer, options: EmbeddingOptions | None = None, identity: str = ""):
        self.model, self.tokenizer = model, tokenizer
        self.options = options or EmbeddingOptions()
        self.identity = identity or f"in-memory:{id(model)}"
        self.identity += f"|{self.options}"

    def encode_queries(self, texts, batch_size: int = 32, progress: bool = False) -> torch.Tensor:
        return encode(self.model, self.tokenizer, texts, self.options, side="query",
                      batch_size=batch_size, progress=progress)

    def encode_passages(self, texts, batch_size: int = 32, progress: bool = False) -> torch.Tensor:
        return encode(self.model, self.tokenizer, texts, self.options, side="passage",
                      batch_size=batch_size, progress=progress)


class SentenceTransformerEncoder:
    """A sentence-transformers directory; its prompts "query"/"passage" are used when present."""

    def __init__(self, path, device: str = "cpu"):
        from sentence_transformers import SentenceTransformer  # lazy: optional (retrieval extra)

        self.model = SentenceTransformer(str(path), device=device)
        self.identity = _identity(path)

    def _encode(self, texts, prompt_name, batch_size, progress):
        prompt = prompt_name if prompt_name in (self.model.prompts or {}) else None
        out = self.model.encode(list(texts), prompt_name=prompt, batch_size=batch_size,
                                show_progress_bar=progress, convert_to_tensor=True)
        return out.float().cpu()

    def encode_queries(self, texts, batch_size: int = 32, progress: bool = False) -> torch.Tensor:
        return self._encode(texts, "query", batch_size, progress)

    def encode_passages(self, texts, batch_size: int = 32, progress: bool = False) -> torch.Tensor:
        return self._encode(texts, "passage", batch_size, progress)


def load_encoder(path, *, pooling: str = "mean", normalize: bool = True, max_length: int = 512):
    """An ST directory (modules.json) or one of our checkpoints (run dir / checkpoint dir)."""
    path = Path(os.path.expanduser(str(path)))
    if (path / "modules.json").is_file():
        return SentenceTransformerEncoder(path)
    if is_megatron_checkpoint(path):
        loaded = load_megatron_checkpoint(path)
        options = EmbeddingOptions(pooling=pooling, normalize=normalize, max_length=max_length)
        return OurEncoder(loaded.model, loaded.tokenizer, options, identity=_identity(loaded.checkpoint.path))
    raise FileNotFoundError(f"{path} is neither a sentence-transformers directory (modules.json) nor a "
                            "megatron-biglm checkpoint; export one with `python -m megatron_biglm.cli.convert to-st`")
