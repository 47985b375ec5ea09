"""BEIR folders as a user writes them: a repeated id, float relevance grades, an empty
queries file, and the eval_retrieval command line's own checks (batch size, a missing model)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_biglm.finetune.retrieval.beir import BeirFormatError, load_beir


def beir_folder(root: Path, corpus, queries, qrels: str) -> Path:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "queries.jsonl").write_text("".join(json.dumps(r) + "\n" for r in queries))
    (root / "qrels" / "test.tsv").write_text(qrels)
    return root


CORPUS = [{"_id": "d1", "text": "red apples"}, {"_id": "d2", "text": "blue sea"}]
QUERIES = [{"_id": "q1", "text": "fruit"}, {"_id": "q2", "text": "water"}]
QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t2\n"


def test_a_repeated_document_id_is_an_error_naming_both_lines_unless_the_first_is_kept(tmp_path):
    folder = beir_folder(tmp_path, [*CORPUS, {"_id": "d1", "text": "a later row"}], QUERIES, QRELS)
    with pytest.raises(BeirFormatError, match=r"corpus\.jsonl:3: _id 'd1' is already the id of line 1.*"
                                              r"--keep-first-duplicate"):
        load_beir(folder)
    kept = load_beir(folder, duplicate_ids="keep_first")
    assert kept.corpus == {"d1": "red apples", "d2": "blue sea"}
    assert kept.notes == ["corpus.jsonl: 1 row(s) repeating an earlier _id were left out (the first kept)"]


def test_integral_float_grades_read_as_integers_and_others_name_their_line(tmp_path):
    as_floats = load_beir(beir_folder(tmp_path / "f", CORPUS, QUERIES, "q1\td1\t1.0\nq2\td2\t2.0\n"))
    as_ints = load_beir(beir_folder(tmp_path / "i", CORPUS, QUERIES, QRELS))
    assert as_floats.qrels == as_ints.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    assert all(type(v) is int for rels in as_floats.qrels.values() for v in rels.values())
    with pytest.raises(BeirFormatError, match=r"test\.tsv:4: relevance '0\.5' is not a whole number"):
        load_beir(beir_folder(tmp_path / "h", CORPUS, QUERIES, QRELS + "q1\td2\t0.5\n"))


def test_an_empty_queries_file_says_so(tmp_path):
    with pytest.raises(BeirFormatError, match=r"queries\.jsonl holds no query"):
        load_beir(beir_folder(tmp_path, CORPUS, [], QRELS))


def test_eval_retrieval_checks_the_batch_size_and_the_model_path(tmp_path, capsys):
    from megatron_biglm.cli.eval_retrieval import main

    folder = beir_folder(tmp_path / "set", CORPUS, QUERIES, QRELS)
    with pytest.raises(SystemExit) as exited:
        main(["--model", str(tmp_path), "--data", str(folder), "--batch-size", "0"])
    assert exited.value.code == 2 and "--batch-size: '0' is not a whole number >= 1" in capsys.readouterr().err
    assert main(["--model", str(tmp_path / "no_model"), "--data", str(folder)]) == 1
    assert f"--model {tmp_path / 'no_model'} does not exist" in capsys.readouterr().err


def test_qrels_read_alike_with_or_without_a_header(tmp_path):
    plain = load_beir(beir_folder(tmp_path / "p", CORPUS, QUERIES, QRELS))
    headerless = load_beir(beir_folder(tmp_path / "n", CORPUS, QUERIES, QRELS.split("\n", 1)[1]))
    assert plain.qrels == headerless.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    with pytest.raises(BeirFormatError, match=r"test\.tsv:3: expected query-id, corpus-id, score"):
        load_beir(beir_folder(tmp_path / "s", CORPUS, QUERIES, QRELS.replace("q2\td2\t2", "q2\td2")))


def test_a_contrastive_fine_tune_names_its_own_option_for_a_repeated_id_and_keeps_the_first_with_it(tmp_path):
    """The contrastive kind reads its validation folders the same way; its refusal names the
    config key that opts in (the command-line flag is eval_retrieval's), and with it the run
    prepares on the first row of each id."""
    from megatron_biglm.config import ConfigError, FinetuneConfig
    from megatron_biglm.finetune.kinds.contrastive import ContrastiveRecipe
    from megatron_biglm.finetune.tasks import get_task

    folder = beir_folder(tmp_path, CORPUS, [*QUERIES, {"_id": "q1", "text": "again"}], QRELS)
    task = {"kind": "contrastive"}

    def recipe(**options):
        return ContrastiveRecipe(get_task(task), None, FinetuneConfig(
            task=task, data={"validation": str(folder)}, train_examples=0, options=options))

    with pytest.raises(ConfigError, match=r"finetune\.data\.validation: .*queries\.jsonl:3: _id 'q1'.*"
                                          r"finetune\.options\.keep_first_duplicate=true") as refused:
        recipe().prepare(None)
    assert "--keep-first-duplicate" not in str(refused.value)
    kept = recipe(keep_first_duplicate=True)
    kept.prepare(None)
    assert kept.eval_examples == {"validation": [str(folder)]}


def test_empty_queries_and_documents_are_skipped_counted_and_noted(tmp_path):
    """An empty query would be scored against every document, an empty document retrieved for
    nothing: both are left out, counted, and named with their lines; so are the qrels judgments
    of a left-out document (a query left with no relevant document is skipped, as BEIR does)."""
    corpus = [*CORPUS, {"_id": "d3", "text": "  "}, {"_id": "d4", "title": "", "text": ""}]
    queries = [*QUERIES, {"_id": "q3", "text": ""}, {"_id": "q4", "text": "empty sea"}]
    qrels = QRELS + "q3\td1\t1\nq4\td3\t1\nq1\td4\t1\n"
    data = load_beir(beir_folder(tmp_path, corpus, queries, qrels))
    assert data.corpus == {"d1": "red apples", "d2": "blue sea"} and data.skipped_documents == 2
    assert data.queries == {"q1": "fruit", "q2": "water"} and data.empty_query_lines == [3]
    assert data.qrels == {"q1": {"d1": 1}, "q2": {"d2": 2}}
    assert data.skipped_queries == 2  # q3 (empty), q4 (its only relevant document was empty)
    assert data.notes == ["corpus.jsonl: 2 document(s) with empty text skipped (line(s) 3, 4)",
                          "queries.jsonl: 1 query(ies) with empty text skipped (line(s) 3)",
                          "qrels/test.tsv: 2 judgment(s) of documents with empty text left out"]
    with pytest.raises(BeirFormatError, match=r"queries\.jsonl holds no query with text"):
        load_beir(beir_folder(tmp_path / "none", CORPUS, [{"_id": "q1", "text": " "}], QRELS))


def test_a_contrastive_fine_tune_reports_the_empty_queries_its_validation_leaves_out(tmp_path):
    from megatron_biglm.config import FinetuneConfig
    from megatron_biglm.finetune.kinds.contrastive import ContrastiveRecipe
    from megatron_biglm.finetune.tasks import get_task

    folder = beir_folder(tmp_path, [*CORPUS, {"_id": "d3", "text": ""}],
                         [*QUERIES, {"_id": "q3", "text": " "}], QRELS + "q3\td1\t1\n")
    task = {"kind": "contrastive"}
    recipe = ContrastiveRecipe(get_task(task), None, FinetuneConfig(
        task=task, data={"validation": str(folder)}, train_examples=0))
    recipe.prepare(None)
    assert recipe.row_summaries()["validation"].startswith(
        "rows 4: kept 2, dropped 2 (empty_document 1, empty_field 1)")
    assert any("queries.jsonl:3: empty_field: query text" in line for line in recipe.row_details())
