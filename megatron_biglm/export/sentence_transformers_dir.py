"""Write a sentence-transformers directory from any of our checkpoints (`to-st`).

The directory is what `SentenceTransformer(dir)` loads with no project import: the
transformer is our native EuroBERT HF export (`to_hf`, with its tokenizer), followed by a
Pooling module (mean / cls / last token over the attention mask) and, when asked, a
Normalize module; the query/passage prefixes go into `config_sentence_transformers.json`'s
prompts, the passage prefix also as `document` and `corpus` (the names `encode_document`, which
MTEB calls, looks up), so every sentence-transformers entry point (`encode_query`,
`encode_document`, `encode(prompt_name=...)`) embeds exactly as training and our evaluation
did. sentence-transformers writes its own files (modules.json, 1_Pooling/config.json,
sentence_bert_config.json) so the format is always the one the installed version reads.

The pooling names here are ours (`model/pooling.py`): mean, first (alias cls), last.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

from megatron_biglm.checkpoint.task_head import DEFAULT_PROMPTS, EmbedderRecord
from megatron_biglm.config.trained_checkpoint import open_checkpoint

from .convert_to_hf import to_hf

#: our pooling mode -> sentence-transformers' pooling_mode
ST_POOLING = {"mean": "mean", "first": "cls", "cls": "cls", "last": "lasttoken"}


def our_pooling(mode: str) -> str:
    """'cls' -> 'first' (model/pooling.py's name); mean/first/last unchanged."""
    if mode not in ST_POOLING:
        raise ValueError(f"pooling must be one of {sorted(ST_POOLING)}, got {mode!r}")
    return "first" if mode == "cls" else mode


def st_prompts(prompts: dict) -> dict:
    """Our {query, passage} prefixes under every name sentence-transformers reads them by:
    `encode_query` -> query, `encode_document` -> document (else passage, corpus)."""
    out = dict(prompts)
    for alias in ("document", "corpus"):
        out[alias] = prompts["passage"]
    return out


def build_st_directory(hf_dir, output, *, pooling: str = "mean", normalize: bool = True,
                       prompts: dict | None = None, max_seq_length: int | None = None) -> Path:
    """Wrap the HF model directory `hf_dir` as a sentence-transformers model saved to `output`."""
    try:
        from sentence_transformers import SentenceTransformer  # lazy: optional (retrieval extra)
        from sentence_transformers.models import Normalize, Pooling, Transformer  # lazy: optional (retrieval extra)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("to-st needs sentence-transformers: pip install -e '.[retrieval]'") from exc
    transformer = Transformer(str(hf_dir), max_seq_length=max_seq_length)
    dim = transformer.get_embedding_dimension() if hasattr(transformer, "get_embedding_dimension") \
        else transformer.get_word_embedding_dimension()
    modules = [transformer, Pooling(dim, pooling_mode=ST_POOLING[pooling])]
    if normalize:
        modules.append(Normalize())
    prompts = st_prompts(prompts or DEFAULT_PROMPTS)
    model = SentenceTransformer(modules=modules, prompts=prompts, device="cpu",
                                similarity_fn_name="cosine" if normalize else "dot")
    model.save(str(output))
    return Path(output)


def to_st(checkpoint, output, *, pooling: str | None = None, normalize: bool | None = None, tokenizer=None,
          prompts: dict | None = None, progress: bool = False) -> Path:
    """A megatron-biglm checkpoint (pretrained or fine-tuned) -> sentence-transformers dir.

    A contrastive fine-tune embeds as it was trained and validated: its pooling,
    normalisation, prefixes and max length (the tokens each text keeps) come from its
    task-head record (`checkpoint/task_head.py`) unless given here; any other checkpoint gets the
    record's defaults (mean pooling, normalised, the default prefixes) and the model's own length."""
    record, _ = open_checkpoint(checkpoint).task_head()
    trained = record if isinstance(record, EmbedderRecord) else EmbedderRecord()
    pooling = pooling or trained.pooling
    normalize = trained.normalize if normalize is None else normalize
    prompts = prompts or trained.prompts
    our_pooling(pooling)  # refuse an unknown mode before converting anything
    output = Path(output)
    if output.exists() and any(output.iterdir()):
        raise FileExistsError(f"{output} exists and is not empty: pick a new --output directory")
    with tempfile.TemporaryDirectory(prefix="to_st_") as tmp:
        hf_dir = Path(tmp) / "hf"
        to_hf(str(checkpoint), str(hf_dir), tokenizer=tokenizer, progress=progress)
        build_st_directory(hf_dir, output, pooling=pooling, normalize=normalize, prompts=prompts,
                           max_seq_length=trained.max_length)
    return output
