"""The quickstart's yardsticks: the unigram-entropy floor, the held-out fill-mask check, and the
95 % interval of an accuracy. Each is checked against a number worked out by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest

from megatron_biglm.evaluation.fill_mask_check import fill_mask_report, masked_word_examples
from megatron_biglm.evaluation.intervals import wilson_interval
from dataset_fixtures import process_group  # noqa: F401 (fixture)
from train_fixtures import train_data  # noqa: F401 (fixture)


def _write(prefix, documents, dtype=np.uint16):
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in documents:
        builder.add_document(np.asarray(doc, dtype=dtype), [len(doc)])
    builder.finalize(f"{prefix}.idx")
    return str(prefix)


def test_unigram_entropy_of_known_distributions(tmp_path):
    from megatron_biglm.data.indexed_tools import CorruptDatasetError
    from megatron_biglm.data.unigram import unigram_counts, unigram_entropy

    uniform = _write(tmp_path / "uniform", [[0, 1, 2, 3], [3, 2, 1, 0]])
    assert unigram_entropy(uniform) == pytest.approx(math.log(4))
    # p = (1/2, 1/4, 1/4) across documents: H = 1.5 ln 2
    skewed = _write(tmp_path / "skewed", [[7, 7, 9], [8]])
    assert unigram_entropy(skewed) == pytest.approx(1.5 * math.log(2))
    assert unigram_counts(skewed, vocab_size=16).tolist()[7:10] == [2, 1, 1]
    with pytest.raises(CorruptDatasetError, match="holds token id 9"):
        unigram_entropy(skewed, vocab_size=9)  # the same checks as every dataset open


class _Tokenizer:
    """Whitespace 'BPE': a word is one token iff it is in `single`."""
    mask_token = "<mask>"

    def __init__(self, single):
        self.single = set(single)

    def __call__(self, text, add_special_tokens=False):
        word = text.strip()
        return {"input_ids": [0] if word in self.single else [0, 1]}


def test_masked_word_examples_mask_a_single_token_word_with_its_space():
    tok = _Tokenizer({"king", "dead"})
    lines = ["My lord, the king is dead.", "Nothing here qualifies at all.", "Long live the king"]
    examples = masked_word_examples(lines, tok, 5, seed=0)
    assert len(examples) == 2  # the middle line has no single-token word
    for ex in examples:
        assert ex["answer"] in {"king", "dead"}
        # the mask takes the word's place together with the space before it
        assert ex["text"].replace("<mask>", " " + ex["answer"]) == ex["line"]
        assert " <mask>" not in ex["text"]
    assert masked_word_examples(lines, tok, 5, seed=0) == examples  # seeded


def test_fill_mask_report_scores_against_the_removed_word():
    examples = [{"text": f"line {i}<mask>", "answer": answer, "line": ""}
                for i, answer in enumerate(["king", "king", "lord", "the"])]
    answers = {0: ["king", "queen", ","], 1: [",", "king", "."], 2: ["\n", ",", "."], 3: ["the", "a", "his"]}

    def fill(text, top_k):
        i = int(text.split()[1].split("<")[0])
        return [{"token_str": " " + t, "score": 0.1} for t in answers[i][:top_k]]

    report = fill_mask_report(fill, examples, top_k=3, show=2)
    assert report["examples"] == 4
    assert report["top1_accuracy"] == 0.5 and report["top3_accuracy"] == 0.75
    assert report["top1_is_a_word"] == 0.5
    assert report["context_free_best"] == {"word": "king", "accuracy": 0.5}
    assert [s["answer"] for s in report["shown"]] == ["king", "king"]
    with pytest.raises(ValueError, match="no fill-mask examples"):
        fill_mask_report(fill, [])


def test_wilson_interval_matches_hand_computed_values():
    lo, hi = wilson_interval(40, 100)  # p = 0.4, n = 100
    assert lo == pytest.approx(0.3094, abs=1e-4) and hi == pytest.approx(0.4980, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval(1, 0)


def test_held_out_documents_are_the_validation_split(corpus_jsonl, train_data, process_group):
    """The fill-mask and next-line checks read only documents the model never trained on:
    exactly the ones megatron's builder puts in the validation split under tiny_cpu.yaml."""
    import json

    import yaml

    from megatron_biglm.data.pretrain_data import build_pretrain_datasets
    from megatron_biglm.data.token_ids import TokenIds
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.cli.quickstart import TINY_CPU_CONFIG, held_out_documents

    split = yaml.safe_load(TINY_CPU_CONFIG.read_text())["data"]["split"]
    token_ids = TokenIds.from_tokenizer(load_tokenizer(train_data.tokenizer))
    ds = build_pretrain_datasets({"blend": [train_data.prefix], "split": split, "seq_length": 64},
                                 token_ids=token_ids, train_samples=8, valid_samples=8)
    docs = [json.loads(line)["text"] for line in open(corpus_jsonl, encoding="utf-8")]
    held_out = held_out_documents(corpus_jsonl)
    assert held_out == [docs[i] for i in sorted(set(ds.valid.indices.tolist()))]
    assert not set(ds.train.indices.tolist()) & set(ds.valid.indices.tolist())
    assert 0 < len(held_out) < len(docs) / 10
