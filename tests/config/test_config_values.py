"""Values a config refuses at load: a non-finite number (`optimizer.lr=inf` trained on NaN
losses; `nan` passes every bound check) names its key; a fine-tune's split that names no file
(`finetune.data.SPLIT`) names its split, while the forms a split takes load as written."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from megatron_biglm.config import ConfigError, derive, load_config


@pytest.mark.parametrize("override", ["optimizer.lr=inf", "optimizer.lr=nan", "optimizer.min_lr=-inf",
                                      "optimizer.clip_grad=.inf", "training.global_batch_size=inf"])
def test_a_non_finite_number_is_refused_naming_the_key(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"config key '{key}'.*(not a finite number|whole number)"):
        load_config(None, [override])


def test_a_non_finite_number_in_a_file_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: .nan\n")
    with pytest.raises(ConfigError, match="config key 'optimizer.lr': nan is not a finite number"):
        load_config(str(path))


@pytest.mark.parametrize("value, where", [("[]", "finetune.data.train="), ("''", "finetune.data.train="),
                                          ("[a.jsonl, '']", r"finetune.data.train\[1\]="),
                                          ("'  '", "finetune.data.train=")])
def test_a_split_that_names_no_file_is_refused_at_load(value, where):
    with pytest.raises(ConfigError, match=rf"{where}.* names no file: give a path, a directory or a glob"):
        load_config(None, ["finetune.task=cb", f"finetune.data.train={value}"])


def test_a_split_that_is_a_mapping_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"'finetune.data.train': expected a string"):
        load_config(None, ["finetune.task=cb", "finetune.data.train={path: a.jsonl}"])


def test_the_forms_of_a_split_load_as_written_and_round_trip(tmp_path):
    data = {"train": "data/*.jsonl", "validation": ["a.jsonl", "dir/"], "test": None}
    config = load_config({"finetune": {"task": "cb", "data": data}})
    assert config.finetune.data == data
    path = tmp_path / "config.yaml"
    path.write_text(config.to_yaml())
    assert load_config(str(path)).finetune.data == data


def test_a_split_set_in_code_as_a_path_object_is_refused_naming_the_fix():
    base = load_config(None, ["finetune.task=cb"])
    with pytest.raises(ConfigError, match=r"finetune\.data\.train\[1\] is a \w*Path .*pass str\(path\)"):
        derive(base, finetune=dataclasses.replace(base.finetune, data={"train": ["a.jsonl", Path("b.jsonl")]}))
