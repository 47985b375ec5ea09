"""lm-eval end to end, offline: built-in task configs on local jsonl in the real HF schemas,
and a constructed task whose answers a small overfit model knows."""
from __future__ import annotations

import json
import random

import pytest
import yaml
from eval_fixtures import (bert_dir, bf_greedy_reveal, corpus_sentences,  # noqa: F401
                           one_torch_thread, overfit_biglm_style, tiny_bert, wordpiece_dir,
                           write_task_data)

import megatron_biglm.evaluation  # noqa: F401 - registers the models
from megatron_biglm.evaluation.models import HFMaskedLMEvalLM
from megatron_biglm.evaluation.tasks import (MissingTaskData, local_task_manager,
                                             write_local_task_yamls)

REQUIRED = ["arc_easy", "piqa", "hellaswag", "boolq", "winogrande"]


def test_local_yamls_include_the_builtin_config_and_point_at_absolute_files(tmp_path):
    data = write_task_data(tmp_path / "data", ["arc_easy", "piqa"])
    written, skipped = write_local_task_yamls(["arc_easy", "piqa"], data, tmp_path / "yaml")
    assert skipped == []
    arc = yaml.safe_load(written["arc_easy"].read_text())
    assert arc["include"].endswith("lm_eval/tasks/arc/arc_easy.yaml")
    assert arc["dataset_path"] == "json" and arc["tag"] == [] and arc["dataset_name"] is None
    assert arc["dataset_kwargs"]["data_files"] == {"test": str((data / "arc_easy.jsonl").resolve())}
    assert arc["test_split"] == "test" and arc["validation_split"] is None
    piqa = yaml.safe_load(written["piqa"].read_text())  # piqa has no test split: validation
    assert piqa["validation_split"] == "validation" and piqa["test_split"] is None
    assert list(piqa["dataset_kwargs"]["data_files"]) == ["validation"]


def test_missing_local_data_is_listed_or_skipped_and_counted(tmp_path):
    data = write_task_data(tmp_path / "data", ["boolq"])
    with pytest.raises(MissingTaskData, match=r"sciq: .*sciq\.jsonl or .*sciq/test\.jsonl"):
        write_local_task_yamls(["boolq", "sciq"], data, tmp_path / "yaml")
    (data / "sciq").mkdir()
    sciq = write_task_data(tmp_path / "sciq_rows", ["sciq"]) / "sciq.jsonl"
    (data / "sciq" / "test.jsonl").write_text(sciq.read_text())
    written, skipped = write_local_task_yamls(["boolq", "sciq", "piqa"], data, tmp_path / "y2",
                                              skip_missing=True)
    assert sorted(written) == ["boolq", "sciq"] and skipped == ["piqa"]


def test_simple_evaluate_offline_on_builtin_tasks(tmp_path, bert_dir):
    """acc / acc_norm from lm-eval equal the ones recomputed from each logged response, and
    each response equals the brute-force beam score of its (context, continuation)."""
    import lm_eval

    data = write_task_data(tmp_path / "data", REQUIRED, n=3)
    write_local_task_yamls(REQUIRED, data, tmp_path / "yaml")
    results = lm_eval.simple_evaluate(
        model="hf-mlm", model_args={"pretrained": str(bert_dir), "dtype": "float64",
                                    "progress": False},
        tasks=REQUIRED, task_manager=local_task_manager(tmp_path / "yaml"), log_samples=True)
    reference = HFMaskedLMEvalLM(pretrained=str(bert_dir), dtype="float64", progress=False)
    mask_id, bos = reference.adapter.special.mask_id, reference.adapter.special.bos_id
    tok = reference.tokenizer
    assert results["config"]["masked_lm_eval"]["split_mode"] == "4d-mask"
    for task in REQUIRED:
        metrics = results["results"][task]
        samples = results["samples"][task]
        assert len(samples) == 3
        accs, norms = [], []
        for s in samples:
            scores = [r[0][0] for r in s["resps"]]
            for (context, continuation), score in zip(s["arguments"], scores):
                ctx = tok(context, add_special_tokens=False)["input_ids"]
                whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
                want = bf_greedy_reveal(reference.adapter.model, (bos, *ctx),
                                        tuple(whole[len(ctx):]), mask_id)
                assert score == pytest.approx(want, abs=1e-5)
            # winogrande scores several contexts against one continuation: gold is the option
            target = int(s["doc"]["answer"]) - 1 if task == "winogrande" else s["target"]
            accs.append(float(max(range(len(scores)), key=scores.__getitem__) == target))
            lengths = [len(c.removeprefix(" ")) for _, c in s["arguments"]]
            normed = [sc / n for sc, n in zip(scores, lengths)]
            norms.append(float(max(range(len(normed)), key=normed.__getitem__) == target))
        assert metrics["acc,none"] == pytest.approx(sum(accs) / len(accs))
        if task in ("arc_easy", "piqa", "hellaswag"):
            assert metrics["acc_norm,none"] == pytest.approx(sum(norms) / len(norms))


def _memorized_endings_task(tmp_path, sentences, seed=0):
    """A multiple-choice task: the first half of a training sentence, its true second half
    among three second halves of other training sentences."""
    rng = random.Random(seed)
    halves = [(" ".join(s.split()[:len(s.split()) // 2]),
               " ".join(s.split()[len(s.split()) // 2:])) for s in sentences]
    rows = []
    for i, (context, ending) in enumerate(halves):
        others = [e for j, (_, e) in enumerate(halves) if j != i]
        choices = [ending] + rng.sample(others, 3)
        rng.shuffle(choices)
        rows.append({"context": context, "choices": choices, "label": choices.index(ending)})
    data = tmp_path / "memorized.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"task": "memorized_endings", "dataset_path": "json",
              "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test",
              "output_type": "multiple_choice", "doc_to_text": "{{context}}",
              "doc_to_choice": "{{choices}}", "doc_to_target": "{{label}}",
              "metric_list": [{"metric": "acc"}, {"metric": "acc_norm"}]}
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "memorized_endings.yaml").write_text(yaml.safe_dump(config))
    return tmp_path / "tasks"


def test_overfit_model_answers_its_training_text_far_above_chance(tmp_path, corpus_jsonl,
                                                                  wordpiece_dir):
    import lm_eval
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(wordpiece_dir))
    sentences = corpus_sentences(corpus_jsonl, 8)
    model, loss = overfit_biglm_style(tiny_bert(len(tok), seed=0, hidden=64), tok, sentences,
                                      steps=200, lr=4e-3, seed=0)
    # Seeds 0, 1, 2 (model, masking and task seed together; 3 seeds, not 5: minutes each on a
    # shared CPU): loss 6.39-6.43 at step 1 -> 0.08-0.33 at step 200, accuracy 1.00 with both
    # scorings. Bars: 1/3 of the smallest drop (6.09) below seed 0's start (6.39), and chance
    # (0.25) + 1/3 of the smallest gain over it (0.75).
    assert loss < 4.4
    task_dir = _memorized_endings_task(tmp_path, sentences, seed=0)
    for scoring in ("beam", "l2r"):
        lm = HFMaskedLMEvalLM(pretrained=model, tokenizer=tok, scoring=scoring, progress=False)
        results = lm_eval.simple_evaluate(model=lm, tasks=["memorized_endings"],
                                          task_manager=local_task_manager(task_dir))
        acc = results["results"]["memorized_endings"]["acc,none"]
        assert acc >= 0.5, (scoring, acc)  # chance is 0.25 (4 choices, 8 questions)
