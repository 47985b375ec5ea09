"""Fixtures for the data-tool tests: a byte-level BPE trained on the real sample corpus,
and helpers that compute expected token ids and read datasets back with megatron-core."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def corpus_texts(corpus_jsonl) -> list[str]:
    return [json.loads(line)["text"] for line in Path(corpus_jsonl).read_text("utf-8").splitlines()]


@pytest.fixture(scope="session")
def bpe_dir(corpus_jsonl, tmp_path_factory) -> Path:
    """Our byte-level BPE (vocab 1000: small, quick to train) trained on the corpus."""
    from megatron_biglm.data.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer([corpus_jsonl], 1000, tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="session")
def bpe(bpe_dir):
    from megatron_biglm.data.tokenizer import load_tokenizer

    return load_tokenizer(bpe_dir)


def expected_ids(tokenizer, texts, append_eod: bool) -> list[list[int]]:
    """What every document must hold: the tokenizer's own ids (no BOS/EOS template) + EOS."""
    eos = [tokenizer.eos_token_id] if append_eod else []
    return [tokenizer(text, add_special_tokens=False)["input_ids"] + eos for text in texts]


def read_back(prefix) -> list[list[int]]:
    """Every document of PREFIX.{bin,idx}, read with megatron-core's IndexedDataset."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(prefix))
    documents = dataset.document_indices
    return [[int(t) for i in range(documents[d], documents[d + 1]) for t in dataset[i]]
            for d in range(len(documents) - 1)]


def load_tool(name: str):
    """The command `megatron_biglm.cli.NAME`, to call its main(argv) in-process."""
    return importlib.import_module(f"megatron_biglm.cli.{name}")
