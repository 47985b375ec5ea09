"""Fixtures for the masked-LM dataset tests: a real BPE and real indexed corpora.

The tokenizer is a tiny byte-level BPE trained here on the Shakespeare scenes of the shared
`corpus_jsonl` fixture; each play becomes its own Megatron indexed corpus (documents end with
EOS, as the preprocessing tool writes them), written with megatron-core's IndexedDatasetBuilder.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

SPECIALS = ["<s>", "</s>", "<pad>", "<mask>"]


@dataclass
class Corpora:
    tokenizer: object  # tokenizers.Tokenizer
    token_ids: object  # TokenIds
    prefixes: dict  # play name -> indexed prefix
    texts: dict  # play name -> list of document texts
    tiny_prefix: str  # 10 short documents, to provoke empty splits

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


def _train_bpe(texts):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _write_indexed(prefix: Path, docs_ids, eos_id):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix) + ".bin", dtype=np.uint16)
    for ids in docs_ids:
        builder.add_document(np.asarray(list(ids) + [eos_id], dtype=np.uint16), [len(ids) + 1])
    builder.finalize(str(prefix) + ".idx")
    return str(prefix)


@pytest.fixture(scope="session")
def corpora(corpus_jsonl, tmp_path_factory) -> Corpora:
    from megatron_biglm.data.token_ids import TokenIds

    rows = [json.loads(line) for line in Path(corpus_jsonl).read_text().splitlines() if line.strip()]
    texts: dict[str, list[str]] = {}
    for row in rows:
        texts.setdefault(row["source"], []).append(row["text"])
    tok = _train_bpe([r["text"] for r in rows])
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    token_ids = TokenIds(vocab_size=tok.get_vocab_size(), mask_id=ids["<mask>"], eos_id=ids["</s>"],
                         pad_id=ids["<pad>"], bos_id=ids["<s>"])
    out = tmp_path_factory.mktemp("indexed")
    prefixes = {}
    for name, docs in sorted(texts.items()):
        prefixes[name] = _write_indexed(out / name, [tok.encode(d).ids for d in docs], ids["</s>"])
    first = sorted(texts)[0]
    tiny = _write_indexed(out / "tiny", [tok.encode(d[:400]).ids for d in texts[first][:10]], ids["</s>"])
    return Corpora(tok, token_ids, prefixes, texts, tiny)


@pytest.fixture
def process_group():
    """A 1-process gloo group for this test only (megatron's builder needs one)."""
    from megatron_biglm.common.process_groups import single_process_group

    with single_process_group():
        yield
