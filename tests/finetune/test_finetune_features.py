"""Seq2seq and head-classification features: layout, split, target length, truncation and
drops counted."""
import pytest
import torch

from finetune_fixtures import ids_of, word_tokenizer
from megatron_biglm.finetune.row_report import EMPTY_TARGET, SOURCE_TOO_LONG, RowReport
from megatron_biglm.finetune.kinds import head as head_classification
from megatron_biglm.finetune.kinds import seq2seq
from megatron_biglm.finetune.kinds.head import HeadEncoder
from megatron_biglm.finetune.kinds.seq2seq import Seq2SeqEncoder


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(["the cat sat on the mat", "a dog ran far away from home"])


def _report(rows):
    report = RowReport()
    report.rows_seen = report.rows_kept = rows
    return report


def test_seq2seq_layout_split_and_target_length(tok):
    bos, eos = tok.bos_token_id, tok.eos_token_id
    enc = Seq2SeqEncoder(tok, max_source_length=16, max_target_length=8)
    ex = enc.encode("the cat sat", "a dog ran")
    assert ex.input_ids == [bos] + ids_of(tok, "the cat sat") + ids_of(tok, "a dog ran")
    assert ex.split == 4 and ex.target_length == 3          # split = len([BOS] + source)
    with_eos = Seq2SeqEncoder(tok, 16, 8, append_eos=True).encode("the cat sat", "a dog ran")
    assert with_eos.input_ids[-1] == eos and with_eos.target_length == 4 and with_eos.split == 4
    assert enc.prefix("the cat sat") == [bos] + ids_of(tok, "the cat sat")
    batch = seq2seq.collate([ex, with_eos], pad_id=tok.pad_token_id)
    assert batch["input_ids"].tolist()[0] == ex.input_ids + [tok.pad_token_id]
    assert batch["split"].tolist() == [4, 4] and batch["target_lengths"].tolist() == [3, 4]
    assert batch["lengths"].tolist() == [7, 8]


def test_seq2seq_truncation_and_drops_counted(tok):
    report = _report(4)
    enc = Seq2SeqEncoder(tok, max_source_length=4, max_target_length=2)
    ex = enc.encode("the cat sat on the mat", "a dog ran", report=report)
    # [BOS] + 3 source tokens; target cut to 2
    assert ex.input_ids == [tok.bos_token_id] + ids_of(tok, "the cat sat") + ids_of(tok, "a dog")
    assert (ex.split, ex.target_length) == (4, 2)
    assert report.truncated == {"source": 1, "target": 1}
    drop = Seq2SeqEncoder(tok, 4, 8, overlong_source="drop")
    assert drop.encode("the cat sat on the mat", "a dog", report=report, source_name="x", line=2) is None
    assert drop.encode("the cat sat", "a dog", report=report) is not None
    assert enc.encode("the cat", "", report=report) is None
    assert report.counts == {SOURCE_TOO_LONG: 1, EMPTY_TARGET: 1}
    assert report.rows_kept == 2 and report.rows_seen == report.rows_kept + report.rows_dropped


def test_head_features_longest_first_truncation(tok):
    bos, eos = tok.bos_token_id, tok.eos_token_id
    enc = HeadEncoder(tok, ("premise", "hypothesis"), max_length=32)
    row = {"premise": "the cat sat on the mat", "hypothesis": "a dog ran"}
    ex = enc.encode(row, label=2)
    assert ex.input_ids == [bos] + ids_of(tok, row["premise"]) + [eos] + ids_of(tok, "a dog ran") + [eos]
    assert ex.length == 12 and ex.label == 2 and ex.split == 0
    report = _report(1)
    # 9 text tokens into 10 - 3 = 7: the premise (6) loses 2 -> 4 vs 3
    short = HeadEncoder(tok, ("premise", "hypothesis"), max_length=10).encode(row, 1, report=report)
    assert short.input_ids == [bos] + ids_of(tok, "the cat sat on") + [eos] + ids_of(tok, "a dog ran") + [eos]
    assert report.truncated == {"premise": 1}
    # 9 into 6 - 3 = 3: longest-first alternates once the two are equal -> 2 and 1
    report = _report(1)
    tiny = HeadEncoder(tok, ("premise", "hypothesis"), max_length=6).encode(row, 1, report=report)
    assert tiny.input_ids == [bos] + ids_of(tok, "the cat") + [eos] + ids_of(tok, "a") + [eos]
    assert report.truncated == {"premise": 1, "hypothesis": 1}
    batch = head_classification.collate([ex, tiny], pad_id=tok.pad_token_id)
    assert batch["lengths"].tolist() == [12, 6] and batch["labels"].tolist() == [2, 1]
    assert (batch["input_ids"][1, 6:] == tok.pad_token_id).all()
