"""A user metric (`module:function`) is called once on the kind's small fake prediction set
before anything is built (finetune/validation.py `probe_user_metrics`): a wrong signature, a
return that is no number, or a dict without the selected score stops the plan naming the metric;
a NaN selected score at a validation is an error, never a silent pick."""
from __future__ import annotations

import itertools
import math
import sys

import pytest

from megatron_biglm.config import ConfigError, load_config
from megatron_biglm.finetune.validation import TaskValidator
from megatron_biglm.run.plan import plan_finetune

REVIEWS = "review,sentiment\nsweet night,pos\nfoul day,neg\nnoble lord,pos\nvile man,neg\n"
SCORES = "review,score\nsweet night,1.5\nfoul day,0.2\nnoble lord,2.0\nvile man,0.0\n"
_names = itertools.count()


@pytest.fixture
def metric(tmp_path, monkeypatch):
    """`metric(body)` -> 'module:score', a module on the path holding `body` (a function `score`)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str) -> str:
        name = f"user_metric_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(body)
        monkeypatch.delitem(sys.modules, name, raising=False)
        return f"{name}:score"
    return write


def plan(tmp_path, tokenizer_dir, task, data=REVIEWS, **finetune):
    (tmp_path / "t.csv").write_text(data)
    return plan_finetune(load_config({
        "run_dir": str(tmp_path / "run"), "data": {"tokenizer": str(tokenizer_dir)},
        "model": {"preset": "tiny", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 64},
        "finetune": {"task": task, "data": {"train": str(tmp_path / "t.csv"), "validation": str(tmp_path / "t.csv")},
                     "max_length": 16, "epochs": 1, **finetune},
        "training": {"micro_batch_size": 2, "global_batch_size": 2}}))


HEAD = {"kind": "head", "fields": ["review"], "label_field": "sentiment"}
REGRESSION = {"kind": "head", "fields": ["review"], "label_field": "score", "problem_type": "regression"}


@pytest.mark.parametrize("body,says", [
    ("def score(predictions):\n    return 1.0\n",
     r"metric 'user_metric_\d+:score' fails on a small fake prediction set of kind head \(predictions \[0, 1, 0, 1\], "
     r"references \[0, 1, 1, 1\]\): TypeError: .*called as function\(predictions, references\)"),
    ("def score(predictions, references):\n    return 'good'\n",
     r"metric 'user_metric_\d+:score' returned a str \('good'\).*returns a number or a dict of numbers"),
    ("def score(predictions, references):\n    return {'hits': [1, 2]}\n",
     r"returned \{'hits': \[1, 2\]\}.*must map score names to numbers"),
    ("def score(predictions, references):\n    raise KeyError('label')\n", r"fails on .*: KeyError: 'label'"),
])
def test_a_broken_user_metric_stops_the_plan_naming_it(body, says, metric, tmp_path, tokenizer_dir):
    with pytest.raises(ConfigError, match=says):
        plan(tmp_path, tokenizer_dir, {**HEAD, "metrics": ["accuracy", metric(body)]})


def test_a_dict_without_the_selected_score_is_refused_before_training(metric, tmp_path, tokenizer_dir):
    name = metric("def score(predictions, references):\n    return {'hits': 1.0}\n")
    with pytest.raises(ConfigError, match=r"finetune\.select_metric='score' is not a score of task custom: its "
                                          r"metrics report \['hits'\]"):
        plan(tmp_path, tokenizer_dir, {**HEAD, "metrics": [name], "select": "score"})
    assert plan(tmp_path, tokenizer_dir, {**HEAD, "metrics": [name]}, select_metric="hits").recipe.select_metric == "hits"


def test_each_kind_hands_its_metric_the_shapes_its_validation_does(metric, tmp_path, tokenizer_dir):
    body = ("def score(predictions, references):\n    assert all(isinstance(p, float) for p in predictions), "
            "predictions\n    return sum(predictions)\n")
    plan(tmp_path, tokenizer_dir, {**REGRESSION, "metrics": ["pearson", metric(body)]}, data=SCORES)
    with pytest.raises(ConfigError, match=r"AssertionError: \[0, 1, 0, 1\]"):
        plan(tmp_path, tokenizer_dir, {**HEAD, "metrics": ["accuracy", metric(body)]})


class _Recipe:
    """What `TaskValidator.validate` reads of a recipe, scoring every split as `scores`."""

    def __init__(self, scores):
        from types import SimpleNamespace
        self.scores, self.history = scores, []
        self.select_split, self.select_metric = "validation", "score"
        self.task = SimpleNamespace(name="custom", kind="head")
        self.options = SimpleNamespace(test_split=None, early_stopping_patience=0)
        self.eval_examples = {"validation": []}

    def eval_split_names(self):
        return ["validation"]

    def evaluate_split(self, model, name, examples, device):  # noqa: ARG002
        return dict(self.scores)


def test_a_nan_selected_score_is_an_error_naming_the_metric(tmp_path):
    validator = TaskValidator(_Recipe({"score": math.nan}), interval=1, steps_per_epoch=1, train_steps=2,
                              run_dir=tmp_path, checkpoint_root=tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=r"finetune\.select_metric='score' is nan on validation at step 1: it cannot "
                                          r"pick the best checkpoint"):
        validator.validate(None, 1, "cpu")
    assert not (tmp_path / "results.json").exists()
    ok = TaskValidator(_Recipe({"score": 0.5}), interval=1, steps_per_epoch=1, train_steps=2,
                       run_dir=tmp_path, checkpoint_root=tmp_path / "ckpt")
    assert ok.validate(None, 1, "cpu")["valid"]["validation"]["score"] == 0.5
