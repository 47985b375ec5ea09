"""Instruction data: both jsonl schemas, “Scaling Effects of Instruction Tuning”'s filters with every drop counted, the chat
template's tokens tagged so the masker never touches them, .npy round trip, and samples that
are a pure function of the global index (so consumed_samples resumes them)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from finetune_fixtures import ids_of, word_tokenizer
from megatron_biglm.objective.instruct import INPUT, TARGET, TEMPLATE

ROWS = [
    {"inputs": "is the sky blue ?", "targets": "yes", "language": "en"},
    {"inputs": "is grass red ?", "targets": "no", "lang": "en-US"},
    {"inputs": "le ciel est bleu ?", "targets": "oui", "language": "fr"},              # other_language
    {"inputs": "write a long answer", "targets": "one two three four five"},           # target_too_long
    {"instruction": "copy the word", "input": "apple pear", "output": "apple"},         # no language field
    {"instruction": "say yes", "output": "yes"},
    {"instruction": "say nothing", "output": "  "},                                     # empty_target
    {"question": "no known schema", "answer": "x"},                                     # missing_field
]
TEMPLATE_SPEC = {"user": "question :", "separator": " input :", "assistant": " answer :", "end": " done"}


@pytest.fixture()
def tokenizer():
    texts = [json.dumps(r) for r in ROWS] + ["question : input : answer : done"]
    return word_tokenizer(texts)


@pytest.fixture()
def rows_file(tmp_path):
    path = tmp_path / "rows.jsonl"
    lines = [json.dumps(r) for r in ROWS] + ["{not json"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_filters_and_counts(tokenizer, rows_file):
    from megatron_biglm.finetune.instruct import build_instruction_data

    data, report = build_instruction_data([rows_file], tokenizer, template=TEMPLATE_SPEC, max_length=32,
                                          max_target_tokens=3, languages=["en"])
    assert len(data) == 4
    assert report.rows_seen == 9 and report.rows_kept == 4
    assert report.as_dict()["dropped"] == {"empty_target": 1, "invalid_json": 1, "missing_field": 1,
                                           "other_language": 1, "target_too_long": 1}
    assert report.notes == {"no_language_field": 2}
    assert "other_language 1" in report.summary_line()
    # no language filter: the French row stays
    data_all, _ = build_instruction_data([rows_file], tokenizer, template=TEMPLATE_SPEC, max_length=32,
                                         max_target_tokens=3, languages=None)
    assert len(data_all) == 5


def test_layout_and_roles(tokenizer, rows_file, tmp_path):
    from megatron_biglm.finetune.instruct import InstructionData, build_instruction_data

    data, _ = build_instruction_data([rows_file], tokenizer, template=TEMPLATE_SPEC, max_length=32, max_target_tokens=3)
    data = InstructionData.load(data.save(tmp_path / "ds"))
    tokens, roles = data.sample(2)  # copy the word / apple pear / apple
    expect = ([0] + ids_of(tokenizer, "question :") + ids_of(tokenizer, "copy the word") + ids_of(tokenizer, "input :")
              + ids_of(tokenizer, "apple pear") + ids_of(tokenizer, "answer :") + ids_of(tokenizer, "apple")
              + ids_of(tokenizer, "done") + [1])
    assert tokens.tolist() == expect
    words = [tokenizer.convert_ids_to_tokens(int(t)) for t in tokens]
    template_words = {"<s>", "</s>", "question", "input", "answer", ":", "done"}
    assert all((w in template_words) == (r == TEMPLATE) for w, r in zip(words, roles))
    start, end = data.target[2]
    assert words[start:end] == ["apple"] and (roles[start:end] == TARGET).all()
    assert (roles == INPUT).sum() == 5


def test_long_inputs_are_cut_and_counted(tokenizer, tmp_path):
    from megatron_biglm.finetune.instruct import build_instruction_data

    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"instruction": "copy the word", "input": " ".join(["apple"] * 40), "output": "apple"}) + "\n"
                    + json.dumps({"instruction": "say yes", "output": "yes"}) + "\n")
    data, report = build_instruction_data([path], tokenizer, template=TEMPLATE_SPEC, max_length=16)
    assert report.truncated == {"input": 1} and data.max_length == 16
    with pytest.raises(ValueError, match="no instruction sample survived"):
        build_instruction_data([path], tokenizer, template=TEMPLATE_SPEC, max_length=6)


def test_samples_are_a_function_of_the_global_index(tokenizer, rows_file):
    from megatron_biglm.data.token_ids import TokenIds
    from megatron_biglm.finetune.instruct import InstructionSamples, build_instruction_data

    data, _ = build_instruction_data([rows_file], tokenizer, template=TEMPLATE_SPEC, max_length=32)
    ids = TokenIds.from_tokenizer(tokenizer)
    full = InstructionSamples(data, 20, 32, ids, seed=3, global_batch=4)
    resumed = InstructionSamples(data, 8, 32, ids, seed=3, global_batch=4, first=12)
    for i in range(8):
        a, b = full[12 + i], resumed[i]
        assert all(np.array_equal(a[k], b[k]) for k in ("tokens", "labels", "loss_mask"))
        assert a["split"] == b["split"] > 0 and a["valid_lengths"] == b["valid_lengths"]
    # one epoch visits every example once
    assert sorted(full.example_index(i) for i in range(len(data))) == list(range(len(data)))
    s = full[0]
    n = s["valid_lengths"]
    assert (s["tokens"][n:] == ids.pad_id).all() and (s["loss_mask"][n:] == 0).all()
    with pytest.raises(ValueError, match="seq_length"):
        InstructionSamples(data, 4, 8, ids, seed=0, global_batch=4)


def test_build_cli(tokenizer, rows_file, tmp_path, capsys):
    from megatron_biglm.cli.instruct_data import main

    tokenizer.save_pretrained(str(tmp_path / "tok"))
    assert main(["build", "--input", str(rows_file), "--tokenizer", str(tmp_path / "tok"), "--out",
                 str(tmp_path / "ds"), "--template", json.dumps(TEMPLATE_SPEC), "--max-length", "32",
                 "--max-target-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "wrote 4 samples" in out and "target_too_long 1" in out and "no_language_field 2" in out
    meta = json.loads((tmp_path / "ds" / "meta.json").read_text())
    assert meta["template"] == TEMPLATE_SPEC and meta["report"]["rows_kept"] == 4


@pytest.mark.slow  # ~10-30 s: model build, 5 steps, a checkpoint
def test_instruct_tune_entry_point_trains_a_few_steps(tokenizer, rows_file, tmp_path, capsys):
    """`python -m megatron_biglm.cli.instruct_tune`: epochs -> train_steps, the recipe through train()."""
    from megatron_biglm.finetune.instruct import build_instruction_data
    from megatron_biglm.cli.instruct_tune import main

    tokenizer.save_pretrained(str(tmp_path / "tok"))
    data, _ = build_instruction_data([rows_file], tokenizer, template=TEMPLATE_SPEC, max_length=32)
    data.save(tmp_path / "ds")
    overrides = {"run_dir": tmp_path / "run", "data.tokenizer": tmp_path / "tok", "data.seq_length": 32,
                 "model.preset": "tiny", "model.num_layers": 1, "model.hidden_size": 32, "model.ffn_hidden_size": 64,
                 "model.vocab_size": len(tokenizer), "training.micro_batch_size": 2, "training.global_batch_size": 2,
                 "training.precision": "fp32", "logging.tensorboard": False, "logging.progress": "plain",
                 "logging.log_interval": 1}
    assert main(["--config", "examples/configs/instruct/scaling_effects.yaml", "--data", str(tmp_path / "ds"),
                 "--epochs", "1.5"] + [f"{k}={v}" for k, v in overrides.items()]) == 0
    out = capsys.readouterr().out
    assert "5 training examples / global batch 2 = 3 steps per epoch (rounded up) x 1.5 epochs = 5 steps" in out
    assert (tmp_path / "run" / "train_done.json").is_file()
