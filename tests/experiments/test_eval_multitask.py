"""python -m megatron_biglm.cli.eval_multitask end to end on a tiny BiGLM export: every number of the Table 5 row
recomputed here by an independent path (brute-force split masks for SuperGLUE, the genset
metric functions on the generations, lm-eval's own `biglm` model for MMLU), and bad input.

MMLU runs offline on the dev questions lm-eval ships (`--mmlu-data lm-eval-smoke`); the hub
path is checked for its clear error with the hub switched off, nothing mocked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from eval_fixtures import biglm_dir, bpe_dir, bf_logprobs, one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.finetune.metrics import accuracy, macro_f1
from megatron_biglm.finetune.metrics.generation import genset_scores
from megatron_biglm.cli.eval_multitask import main
from megatron_biglm.finetune.kinds.verbalizer import VerbalizerEncoder
from megatron_biglm.finetune.tasks import get_task

ROOT = Path(__file__).resolve().parents[2]

_SG_ROWS = {  # real super_glue field names; labels are indices of data_files.SCHEMAS
    "cb": [{"premise": "The cat sat on the mat all day.", "hypothesis": "The cat was on the mat.", "label": 0},
           {"premise": "It rained in the town.", "hypothesis": "The town was dry.", "label": 1},
           {"premise": "She went to the market.", "hypothesis": "She bought apples.", "label": 2},
           {"premise": "The king spoke to his men.", "hypothesis": "The king was silent.", "label": 1}],
    "rte": [{"premise": "A man is reading a book.", "hypothesis": "Someone reads.", "label": 0},
            {"premise": "The dog ran home.", "hypothesis": "The dog flew home.", "label": 1},
            {"premise": "Rome is in Italy.", "hypothesis": "Rome is a city in Italy.", "label": "entailment"}],
    "copa": [{"premise": "The glass fell.", "choice1": "It broke.", "choice2": "It sang.",
              "question": "effect", "label": 0},
             {"premise": "He was hungry.", "choice1": "He slept.", "choice2": "He ate bread.",
              "question": "effect", "label": 1}],
}
_GENSET = [{"source": "Simplify: The feline rested upon the rug.", "reference": "The cat sat on the rug.",
            "dataset": "wiki_auto"},
           {"source": "Paraphrase: How do I learn to cook?", "reference": ["How can I learn cooking?",
                                                                              "How to learn to cook?"],
            "dataset": "qqp"},
           {"source": "Reply: Hello, how are you today?", "reference": "I am fine, thank you.",
            "dataset": "persona_chat"}]


def _write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def inputs(tmp_path):
    sg = tmp_path / "superglue"
    for task, rows in _SG_ROWS.items():
        _write_jsonl(sg / f"{task}.jsonl", rows)
    return sg, _write_jsonl(tmp_path / "genset.jsonl", _GENSET)


def _brute_force_superglue(model_dir: Path, data_dir: Path, split: bool = True):
    """Each task's predictions and metric from full forwards with a loop-built split mask
    (eval_fixtures); `split=False`: full attention (split 0)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from megatron_biglm.finetune.data_files import read_rows

    model = AutoModelForMaskedLM.from_pretrained(str(model_dir)).eval()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out, predictions = {}, {}
    for task in _SG_ROWS:
        spec = get_task(task)
        rows, _ = read_rows([str(data_dir / f"{task}.jsonl")], spec.dataset)
        encoder = VerbalizerEncoder(tok, spec.prompt, 256)
        preds, golds = [], []
        for row in rows:
            ex = encoder.encode(row, row["label"])
            lp = bf_logprobs(model, ex.input_ids, ex.split if split else 0)
            scores = [sum(lp[ex.mask_positions[k], t].item() for k, t in enumerate(ids))
                      for ids in encoder.label_token_ids]
            preds.append(max(range(len(scores)), key=scores.__getitem__))
            golds.append(row["label"])
        out[task] = (macro_f1(preds, golds, list(range(3))) if task == "cb" else accuracy(preds, golds))
        predictions[task] = preds
    return out, predictions


def test_table5_row_equals_independent_recomputation(biglm_dir, inputs, tmp_path, capsys):
    sg_dir, genset = inputs
    out = tmp_path / "mt.json"
    rc = main(["--model", str(biglm_dir), "--label", "tiny", "--device", "cpu",
               "--superglue-data", str(sg_dir), "--genset", str(genset), "--max-new-tokens", "6",
               "--steps", "3", "--output", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())

    expected, predictions = _brute_force_superglue(biglm_dir, sg_dir)
    sg = report["superglue"]
    assert {t: r["predictions"] for t, r in sg["tasks"].items()} == predictions
    assert {t: r["score"] for t, r in sg["tasks"].items()} == pytest.approx(expected, abs=1e-12)
    assert sg["tasks"]["cb"]["metric"] == "macro_f1" and sg["tasks"]["rte"]["rows"] == 3
    assert sg["average"] == pytest.approx(sum(expected.values()) / 3)
    assert sg["missing"] == ["boolq", "wic"]

    gens = report["genset"]["generations"]
    preds = [g["prediction"] for g in gens]
    refs = [g["references"] for g in gens]
    assert refs[1] == _GENSET[1]["reference"] and any(p for p in preds)
    direct = genset_scores(preds, refs)
    assert (report["genset"]["bleu2"], report["genset"]["distinct2"]) == (direct["bleu2"], direct["distinct2"])
    assert report["genset"]["per_dataset"]["qqp"] == genset_scores([preds[1]], [refs[1]])
    # the generations are the generator's, with the CLI's decoding options
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator

    again = MaskPredictGenerator.from_pretrained(str(biglm_dir), device="cpu").generate(
        [r["source"] for r in _GENSET], GenerationConfig(max_new_tokens=6, steps=3))
    assert preds == [o.text.strip() for o in again]

    row = [line for line in printed.splitlines() if line.startswith("| tiny |")]
    assert row == [f"| tiny | - | {100 * sg['average']:.2f} | "
                   f"{100 * direct['bleu2']:.2f} / {direct['distinct2']:.2f} |"]
    assert "MMLU: skipped (no --mmlu-shots given)" in printed
    assert "SuperGLUE AVG over 3 of 5 tasks" in printed
    assert report["mmlu"] == {"skipped": "no --mmlu-shots given"}


def test_split_attention_off_scores_with_full_attention(biglm_dir, inputs, tmp_path):
    sg_dir, _ = inputs
    out = tmp_path / "mt.json"
    assert main(["--model", str(biglm_dir), "--device", "cpu", "--superglue-data", str(sg_dir),
                 "--split-attention", "off", "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["model_info"]["split_attention"] is False
    expected, predictions = _brute_force_superglue(biglm_dir, sg_dir, split=False)
    assert {t: r["predictions"] for t, r in report["superglue"]["tasks"].items()} == predictions
    assert {t: r["score"] for t, r in report["superglue"]["tasks"].items()} == pytest.approx(expected, abs=1e-12)


def test_mmlu_smoke_offline_equals_lm_eval_biglm_model(biglm_dir, tmp_path, capsys):
    """0- and 2-shot on three subjects of lm-eval's shipped dev questions (5, 5 and 3 of
    them); the size-weighted accuracy again from lm-eval's registered `biglm` model."""
    import lm_eval

    from megatron_biglm.evaluation import register_lm_eval_models
    from megatron_biglm.evaluation.mmlu import shipped_dev_questions, write_local_yamls, write_smoke_data
    from megatron_biglm.evaluation.tasks import local_task_manager

    shipped = shipped_dev_questions()
    assert len(shipped) == 57 and sum(map(len, shipped.values())) == 281
    subjects = ["anatomy", "astronomy", "college_chemistry"]
    sizes = [len(shipped[s]) for s in subjects]
    assert sizes == [5, 5, 3]
    out = tmp_path / "mt.json"
    rc = main(["--model", str(biglm_dir), "--label", "tiny", "--device", "cpu", "--mmlu-shots", "0", "2",
               "--mmlu-data", "lm-eval-smoke", "--mmlu-subjects", *subjects, "--output", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    runs = report["mmlu"]["runs"]
    assert report["mmlu"]["source"] == "lm-eval-smoke" and runs["0"]["questions"] == 13

    register_lm_eval_models()
    data = write_smoke_data(tmp_path / "smoke")
    names = write_local_yamls(data, tmp_path / "yamls", 2, subjects)
    for shots in (0, 2):
        res = lm_eval.simple_evaluate(model="biglm", model_args=f"path={biglm_dir},device=cpu,progress=false",
                                      tasks=names, task_manager=local_task_manager(tmp_path / "yamls"),
                                      num_fewshot=shots)
        correct = sum(res["results"][n]["acc,none"] * k for n, k in zip(names, sizes))
        assert runs[str(shots)]["accuracy"] == pytest.approx(correct / 13, abs=1e-12)
    printed = capsys.readouterr().out
    assert (f"| tiny | {100 * runs['0']['accuracy']:.2f} / {100 * runs['2']['accuracy']:.2f} | - | - |"
            in printed)
    assert "MMLU data: lm-eval-smoke" in printed and "MMLU ZS / FS (2-shot)" in printed
    assert "MMLU quick run: subjects anatomy, astronomy, college_chemistry" in printed


def test_mmlu_hub_offline_error_names_the_fix(biglm_dir):
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "megatron_biglm.cli.eval_multitask", "--model", str(biglm_dir),
                           "--mmlu-shots", "0"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "could not load MMLU from the hub (cais/mmlu)" in proc.stderr
    assert "--mmlu-data DIR" in proc.stderr and "lm-eval-smoke" in proc.stderr


@pytest.mark.parametrize("case, message", [
    ("missing_genset", "does not exist"),
    ("genset_schema", 'has no non-empty string "source"'),
    ("sg_schema", "no usable super_glue/cb row"),
    ("sg_empty_dir", "no SuperGLUE task file"),
    ("smoke_5_shot", "at most 2-shot"),
    ("unknown_subject", "unknown MMLU subject(s) astrology"),
    ("mmlu_dir_without_dev", "needs <subject>/dev.jsonl"),
    ("nothing", "nothing to evaluate"),
    ("no_length", "max_new_tokens"),
])
def test_bad_input_exits_2_with_the_fix(biglm_dir, tmp_path, capsys, case, message):
    model = ["--model", str(biglm_dir), "--device", "cpu"]
    good_genset = _write_jsonl(tmp_path / "g.jsonl", _GENSET)
    argv = {
        "missing_genset": ["--genset", str(tmp_path / "nope.jsonl"), "--max-new-tokens", "4"],
        "genset_schema": ["--genset", str(_write_jsonl(tmp_path / "bad.jsonl", [{"src": "x", "reference": "y"}])),
                          "--max-new-tokens", "4"],
        "sg_schema": ["--superglue-data", str(_write_jsonl(tmp_path / "sg" / "cb.jsonl",
                                                           [{"sentence": "x", "label": 0}]).parent)],
        "sg_empty_dir": ["--superglue-data", str(tmp_path)],
        "smoke_5_shot": ["--mmlu-shots", "0", "5", "--mmlu-data", "lm-eval-smoke"],
        "unknown_subject": ["--mmlu-shots", "0", "--mmlu-data", "lm-eval-smoke", "--mmlu-subjects", "astrology"],
        "mmlu_dir_without_dev": ["--mmlu-shots", "5", "--mmlu-data", str(_write_jsonl(
            tmp_path / "mmlu" / "anatomy" / "test.jsonl",
            [{"question": "q?", "choices": ["a", "b", "c", "d"], "answer": 1}]).parents[1])],
        "nothing": [],
        "no_length": ["--genset", str(good_genset)],
    }[case]
    assert main(model + argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after any model-loading progress bar
    assert last.startswith("error: ") and message in last, last


@pytest.mark.slow
def test_megatron_checkpoint_and_its_export_give_the_same_row(gen_checkpoint, gen_export, tmp_path, capsys):
    """One command for both model forms: the checkpoint (megatron adapter, native split) and
    its HF export (4D split mask) score and generate alike."""
    sg = tmp_path / "superglue"
    for task, rows in _SG_ROWS.items():
        _write_jsonl(sg / f"{task}.jsonl", rows)
    genset = _write_jsonl(tmp_path / "genset.jsonl", _GENSET)
    reports = []
    for model in (gen_checkpoint, gen_export):
        out = tmp_path / f"{Path(model).name}.json"
        assert main(["--model", str(model), "--label", "m", "--device", "cpu", "--superglue-data", str(sg),
                     "--genset", str(genset), "--length", "5", "--steps", "3",
                     "--mmlu-shots", "0", "--mmlu-data", "lm-eval-smoke", "--mmlu-subjects", "anatomy",
                     "--output", str(out)]) == 0
        reports.append(json.loads(out.read_text()))
    ckpt, export = reports
    assert {t: r["score"] for t, r in ckpt["superglue"]["tasks"].items()} == \
        {t: r["score"] for t, r in export["superglue"]["tasks"].items()}
    assert [g["prediction"] for g in ckpt["genset"]["generations"]] == \
        [g["prediction"] for g in export["genset"]["generations"]]
    assert ckpt["mmlu"]["runs"]["0"]["accuracy"] == export["mmlu"]["runs"]["0"]["accuracy"]
    assert ckpt["row"] == export["row"]


def test_genset_prompt_is_the_instruction_tuning_layout():
    from megatron_biglm.finetune.instruct.chat_template import TEMPLATES
    from megatron_biglm.finetune.instruct.chat_template import prompt_of

    assert prompt_of("Paraphrase: hi", None) == "Paraphrase: hi"
    t = TEMPLATES["default"]
    assert prompt_of("Paraphrase: hi", "default") == "### Instruction:\nParaphrase: hi\n### Response:\n"
    assert prompt_of("x", "plain") == TEMPLATES["plain"].user + "x" + TEMPLATES["plain"].assistant
    assert t.user == "### Instruction:\n"
