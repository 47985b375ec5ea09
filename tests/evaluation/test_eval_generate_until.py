"""lm-eval `generate_until` for our masked LMs, offline: a local task YAML with
`output_type: generate_until` scoring exact match through `simple_evaluate`, checked against
what the generator returns for the same prompts; and the kwargs mapping of
`evaluation/generation_kwargs.py`."""
from __future__ import annotations

import json

import pytest
import yaml
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401

import megatron_biglm.evaluation  # noqa: F401 - registers the models
from megatron_biglm.evaluation.generation_kwargs import generation_config_from_kwargs
from megatron_biglm.evaluation.tasks import local_task_manager
from megatron_biglm.generation import GenerationConfig, GenerationConfigError, MaskPredictGenerator

PROMPTS = ["To be, or not to be", "O Romeo, Romeo", "Now is the winter of", "Friends, Romans,"]


def test_kwargs_mapping():
    config, capped = generation_config_from_kwargs(
        {"until": "\n", "max_gen_toks": 500, "do_sample": False, "temperature": 0.7, "top_k": 5},
        max_length=128)
    assert capped and config.max_new_tokens == 126 and config.until == ("\n",)
    assert config.temperature == 0 and config.top_k is None and config.overflow == "truncate_left"
    config, capped = generation_config_from_kwargs({"do_sample": True, "top_p": 0.9, "steps": 4,
                                                    "max_new_tokens": 7}, max_length=128)
    assert not capped and config.temperature == 1.0 and config.top_p == 0.9
    assert config.steps == 4 and config.max_new_tokens == 7
    config, _ = generation_config_from_kwargs({"length": 5, "temperature": 0.5}, max_length=128)
    assert config.length == 5 and config.max_new_tokens is None and config.temperature == 0.5
    with pytest.raises(GenerationConfigError, match="did you mean 'steps'"):
        generation_config_from_kwargs({"step": 3}, max_length=128)


def test_simple_evaluate_exact_match_equals_the_generators_answers(gen_export, tmp_path):
    import lm_eval

    gen_kwargs = {"until": ["\n", "."], "max_gen_toks": 5, "do_sample": False, "steps": 3}
    generator = MaskPredictGenerator.from_pretrained(gen_export)
    config, _ = generation_config_from_kwargs(gen_kwargs, max_length=generator.adapter.max_length)
    answers = [o.text for o in generator.generate(PROMPTS, config)]
    assert len(set(answers)) > 1
    # targets: the generator's own answer for the first three prompts, a wrong one for the last
    targets = answers[:3] + [answers[3] + " wrong"]
    data = tmp_path / "gen.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": t}) + "\n"
                            for p, t in zip(PROMPTS, targets)))
    task = {"task": "gen_echo", "dataset_path": "json",
            "dataset_kwargs": {"data_files": {"test": str(data)}}, "test_split": "test",
            "output_type": "generate_until", "doc_to_text": "{{prompt}}",
            "doc_to_target": "{{answer}}", "target_delimiter": "",
            "generation_kwargs": gen_kwargs,
            "metric_list": [{"metric": "exact_match", "aggregation": "mean",
                             "higher_is_better": True}]}
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "gen_echo.yaml").write_text(yaml.safe_dump(task))
    results = lm_eval.simple_evaluate(
        model="biglm", model_args={"path": str(gen_export), "progress": False}, tasks=["gen_echo"],
        task_manager=local_task_manager(tmp_path / "yaml"), log_samples=True)
    samples = results["samples"]["gen_echo"]
    got = {s["doc"]["prompt"]: s["resps"][0][0] for s in samples}
    assert got == dict(zip(PROMPTS, answers))
    expected = sum(a == t for a, t in zip(answers, targets)) / len(PROMPTS)
    assert results["results"]["gen_echo"]["exact_match,none"] == pytest.approx(expected)
    assert expected == 0.75
    assert results["config"]["masked_lm_eval"]["generated_requests"] == len(PROMPTS)


def test_generate_until_on_a_megatron_checkpoint_equals_its_export(gen_checkpoint, gen_export):
    from eval_fixtures import instances

    from megatron_biglm.evaluation.models import BiGLMEvalLM

    reqs = [(p, {"until": ["\n"], "max_gen_toks": 4, "steps": 2}) for p in PROMPTS[:2]]
    mega = BiGLMEvalLM(path=str(gen_checkpoint), progress=False).generate_until(
        instances(reqs, "generate_until"))
    hf = BiGLMEvalLM(path=str(gen_export), progress=False).generate_until(
        instances(reqs, "generate_until"))
    assert mega == hf
    assert GenerationConfig().steps == 10  # defaults untouched by the mapping
