"""SQuAD windows, offsets and n-best answer selection on a hand-made context, including an
answer that crosses a window boundary."""
import pytest

from finetune_fixtures import ids_of, word_tokenizer
from megatron_biglm.finetune.metrics import squad_scores
from megatron_biglm.finetune.row_report import ANSWER_NOT_IN_CONTEXT, RowReport
from megatron_biglm.finetune.tasks import (NO_ANSWER_POSITION, SquadEncoder, nbest_spans,
                                           squad_predictions, window_bounds)

CONTEXT = "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"   # 12 tokens
QUESTION = "Which letters ?"                                                      # 3 tokens
ANSWER = "delta epsilon zeta"                                                     # tokens 3..5


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([CONTEXT, QUESTION, "other question"])


def row(answer=ANSWER, start=None, qid="q1"):
    return {"id": qid, "question": QUESTION, "context": CONTEXT,
            "answers": {"text": [answer], "answer_start": [CONTEXT.index(answer) if start is None else start]}}


def test_window_bounds_overlap_by_doc_stride():
    assert window_bounds(12, 5, 2) == [(0, 5), (3, 8), (6, 11), (9, 12)]
    assert window_bounds(4, 5, 2) == [(0, 4)]
    with pytest.raises(ValueError):
        window_bounds(12, 2, 2)


def test_windows_offsets_and_boundary_crossing_answer(tok):
    # head [BOS] Which letters ? [EOS] = 5 tokens; room = 11 - 3 - 3 = 5 context tokens per
    # window, overlap 2 -> windows over context tokens [0,5) [3,8) [6,11) [9,12)
    enc = SquadEncoder(tok, max_length=11, doc_stride=2, max_query_length=8)
    windows = enc.encode(row())
    assert [w.length for w in windows] == [11, 11, 11, 9]
    w0, w1 = windows[0], windows[1]
    head = [tok.bos_token_id] + ids_of(tok, QUESTION) + [tok.eos_token_id]
    assert w1.input_ids == head + ids_of(tok, "delta epsilon zeta eta theta") + [tok.eos_token_id]
    assert w1.context_start == 5
    # offsets: None outside the context, the word's characters inside
    assert w1.offsets[:5] == [None] * 5 and w1.offsets[-1] is None
    assert [CONTEXT[a:b] for a, b in w1.offsets[5:10]] == ["delta", "epsilon", "zeta", "eta", "theta"]
    # the answer (context tokens 3..5) crosses window 0's end (token 5 is outside [0,5)):
    # window 0 points at the no-answer position, window 1 holds it at inputs 5..7
    assert (w0.has_answer, w0.start_position, w0.end_position) == (False, NO_ANSWER_POSITION, NO_ANSWER_POSITION)
    assert (w1.has_answer, w1.start_position, w1.end_position) == (True, 5, 7)
    assert tok.decode(w1.input_ids[5:8]) == ANSWER
    assert [w.has_answer for w in windows] == [False, True, False, False]
    assert all(w.split == 0 for w in windows)


def test_question_truncation_and_bad_answer_counted(tok):
    report = RowReport()
    report.rows_seen = report.rows_kept = 2
    enc = SquadEncoder(tok, max_length=11, doc_stride=2, max_query_length=2)
    windows = enc.encode(row(), report=report)
    assert windows[0].input_ids[:4] == [tok.bos_token_id] + ids_of(tok, "Which letters") + [tok.eos_token_id]
    assert report.truncated == {"question": 1}
    assert enc.encode(row(start=0), report=report, source="dev.jsonl", line=2) == []
    assert report.counts == {ANSWER_NOT_IN_CONTEXT: 1} and report.rows_kept == 1
    # at evaluation the answers are not needed; the 2-token question leaves 11 - 3 - 2 = 6
    # context tokens per window: [0,6) [4,10) [8,12)
    evaluation = enc.encode({"id": "x", "question": QUESTION, "context": CONTEXT}, training=False)
    assert [(w.window_index, w.length) for w in evaluation] == [(0, 11), (1, 11), (2, 9)]


def _logits(length, values):
    out = [0.0] * length
    for position, value in values.items():
        out[position] = value
    return out


def test_nbest_over_windows(tok):
    enc = SquadEncoder(tok, max_length=11, doc_stride=2, max_query_length=8)
    windows = enc.encode(row(), training=False)[:3]
    # window 0 (context tokens 0..4 at inputs 5..9): "epsilon" (input 9) 3 + 3.5 = 6.5;
    #   "Alpha .. epsilon" (5..9) would score 3.5 + 3.5 = 7 but is 5 tokens > max_answer_length 3;
    #   BOS and question positions get the highest logits but are not context: never chosen.
    # window 1 (tokens 3..7 at inputs 5..9): "delta epsilon zeta" (5..7) 4 + 4 = 8; the pair
    #   start 8 / end 6 would score 4.6 + 3.9 = 8.5 but ends before it starts.
    # window 2 (tokens 6..10): "eta" (input 5) 2.5 + 2.5 = 5; window 1 sees "eta" at input 8
    #   with 4.6 + 0: the span is kept once, with its best score 5.
    starts = [_logits(11, {0: 50, 1: 40, 5: 3.5, 9: 3}), _logits(11, {0: 50, 5: 4, 8: 4.6}),
              _logits(11, {5: 2.5})]
    ends = [_logits(11, {0: 50, 2: 40, 9: 3.5}), _logits(11, {0: 50, 7: 4, 6: 3.9}),
            _logits(11, {5: 2.5})]
    spans = nbest_spans(CONTEXT, windows, starts, ends, n_best=20, max_answer_length=3)
    assert spans[0].text == ANSWER and spans[0].score == pytest.approx(8)
    assert spans[0].window_index == 1
    by_text = {s.text: s for s in spans}
    assert by_text["delta epsilon"].score == pytest.approx(7.9)
    assert by_text["epsilon"].score == pytest.approx(6.5)
    assert by_text["eta"].score == pytest.approx(5) and by_text["eta"].window_index == 2
    assert "Alpha beta gamma delta epsilon" not in by_text and "Which" not in by_text
    assert len(spans) == len({(s.start_char, s.end_char) for s in spans})
    assert [s.score for s in spans] == sorted((s.score for s in spans), reverse=True)
    # allowing 5-token answers admits the long span (7), still below the best (8)
    longer = nbest_spans(CONTEXT, windows, starts, ends, max_answer_length=5)
    assert longer[0].text == ANSWER
    assert {s.text: s.score for s in longer}["Alpha beta gamma delta epsilon"] == pytest.approx(7)
    # n_best also bounds the search: each window pairs only its top-n starts and ends. With 2,
    # window 0's are BOS/question (not context), window 1's pair start 8 with ends 0/7
    # (invalid), and only window 2's "eta" remains.
    assert [s.text for s in nbest_spans(CONTEXT, windows, starts, ends, n_best=2)] == ["eta"]


def test_predictions_end_to_end_with_official_scores(tok):
    enc = SquadEncoder(tok, max_length=11, doc_stride=2, max_query_length=8)
    w1 = enc.encode(row(qid="q1"), training=False)
    w2 = enc.encode(row(qid="q2"), training=False)
    windows = w2 + w1   # any order
    starts = [_logits(w.length, {5: 1.0} if (w.example_id, w.window_index) in {("q1", 1), ("q2", 3)} else {})
              for w in windows]
    ends = [_logits(w.length, {7: 1.0} if (w.example_id, w.window_index) == ("q1", 1) else
                    {6: 1.0} if (w.example_id, w.window_index) == ("q2", 3) else {}) for w in windows]
    preds = squad_predictions({"q1": CONTEXT, "q2": CONTEXT}, windows, starts, ends, max_answer_length=3)
    assert preds == {"q1": ANSWER, "q2": "kappa lambda"}
    scores = squad_scores(preds, {"q1": [ANSWER], "q2": ["lambda"]})
    # q1 exact; q2 "kappa lambda" vs "lambda": P 1/2, R 1 -> F1 2/3
    assert scores["exact_match"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx((1 + 2 / 3) / 2)
