"""A real megatron checkpoint and its HF export for the generation tests.

The checkpoint is written by `from_hf` from a random EuroBERT (logits O(1..10), see
`convert_fixtures.write_random_eurobert`) with a BPE tokenizer trained on Shakespeare, exactly
as the megatron scoring tests build theirs; the export is its `to_hf` directory. Built once per
test process (`_CACHE`), whichever test module asks first.
"""
from __future__ import annotations

import pytest
from convert_fixtures import train_tokenizer, write_random_eurobert

_CACHE: dict = {}


@pytest.fixture(scope="session")
def gen_tokenizer_dir(corpus_jsonl, tmp_path_factory):
    if "tok" not in _CACHE:
        _CACHE["tok"] = train_tokenizer(corpus_jsonl, tmp_path_factory.mktemp("gtok"))
    return _CACHE["tok"]


@pytest.fixture(scope="session")
def gen_checkpoint(gen_tokenizer_dir, tmp_path_factory):
    if "ckpt" not in _CACHE:
        from transformers import AutoTokenizer

        from megatron_biglm.export.convert_from_hf import from_hf

        vocab = len(AutoTokenizer.from_pretrained(str(gen_tokenizer_dir)))
        source = write_random_eurobert(tmp_path_factory.mktemp("gsrc") / "hf", vocab_size=vocab,
                                       tokenizer_dir=gen_tokenizer_dir, seed=5)
        out = tmp_path_factory.mktemp("gckpt") / "ckpt"
        from_hf(source, out, progress=False, verify=False)
        _CACHE["ckpt"] = out
    return _CACHE["ckpt"]


@pytest.fixture(scope="session")
def gen_export(gen_checkpoint, tmp_path_factory):
    if "export" not in _CACHE:
        from megatron_biglm.export.convert_to_hf import to_hf

        out = tmp_path_factory.mktemp("gexport") / "hf"
        to_hf(gen_checkpoint, out, progress=False)
        _CACHE["export"] = out
    return _CACHE["export"]
