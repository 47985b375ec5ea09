"""Real offline data: BIG-bench's gem/xsum pairs and natural_instructions rows from the
PyPI sdist, read back through the fine-tuning data path (slow: a 358 MB download once)."""
import pytest

from megatron_biglm.data.sample_corpus import CorpusUnavailable
from megatron_biglm.finetune import bigbench_data
from megatron_biglm.finetune.data_files import read_rows
from megatron_biglm.finetune.metrics import rouge
from megatron_biglm.finetune.row_report import RowReport
from megatron_biglm.finetune.tasks import Seq2SeqEncoder

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def bigbench_root():
    try:
        return bigbench_data.fetch()
    except CorpusUnavailable as exc:
        pytest.skip(f"the BIG-bench sdist (pip download bigbench==1.0.0) could not be fetched: {exc}")


def test_gem_xsum_pairs_through_the_xsum_schema(bigbench_root, tmp_path):
    report = RowReport()
    n = bigbench_data.write_jsonl(bigbench_data.xsum_rows(report=report), tmp_path / "xsum.jsonl")
    assert n == 1001 and report.rows_kept == 1001 and report.rows_dropped == 0
    rows, read_report = read_rows([tmp_path / "xsum.jsonl"], "xsum")
    assert len(rows) == 1001 and read_report.rows_dropped == 0
    assert rows[0]["id"] == "xsum-test-0"
    assert rows[0]["summary"].startswith("Skiing on Scotland's snow slopes")
    assert len({r["id"] for r in rows}) == 1001
    # the lead-1 baseline (the first line of the article) on real XSUM scores ROUGE-1 in the
    # mid-teens (XSUM's paper: 16.3); a broken reader or metric lands far from it
    leads = [r["document"].strip().split("\n")[0] for r in rows[:300]]
    scores = rouge(leads, [r["summary"] for r in rows[:300]])
    assert 0.10 < scores["rouge1"] < 0.25, scores
    assert scores["rouge2"] < scores["rouge1"]


def test_seq2seq_features_count_real_truncations(bigbench_root):
    from finetune_fixtures import word_tokenizer

    rows = list(bigbench_data.xsum_rows(limit=200))
    tok = word_tokenizer([r["document"] for r in rows] + [r["summary"] for r in rows])
    enc = Seq2SeqEncoder(tok, max_source_length=128, max_target_length=32)
    report = RowReport()
    report.rows_seen = report.rows_kept = len(rows)
    examples = [enc.encode(r["document"], r["summary"], report=report) for r in rows]
    long_docs = sum(len(tok(r["document"], add_special_tokens=False)["input_ids"]) > 127 for r in rows)
    long_sums = sum(len(tok(r["summary"], add_special_tokens=False)["input_ids"]) > 32 for r in rows)
    assert long_docs > 100   # news articles are long
    assert report.truncated["source"] == long_docs and report.truncated.get("target", 0) == long_sums
    assert all(e.split <= 128 and e.target_length <= 32 for e in examples)


def test_natural_instructions_rows(bigbench_root):
    names = bigbench_data.instruction_subtasks()
    assert len(names) == 61 and names[0] == "subtask001_quoref_question_generation"
    report = RowReport()
    rows = list(bigbench_data.instruction_rows([names[0]], report=report))
    assert len(rows) == report.rows_kept == 4225 and report.rows_dropped == 0
    assert rows[0]["instruction"].startswith("Definition:")
    assert rows[0]["input"].startswith("Passage:")
    assert all(r["output"] == r["outputs"][0] and r["task"] == names[0] for r in rows)
    assert len(list(bigbench_data.instruction_rows(names[:3], limit_per_task=7))) == 21
