"""The one YAML reader of config files (common/yaml_file.py): a key written twice in one
mapping is refused naming the key and both lines; everything else reads as `yaml.safe_load`."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings, strategies as st

from megatron_biglm.common.yaml_file import DuplicateKeyError, load_yaml


def test_a_section_written_twice_names_the_key_and_both_lines():
    text = "optimizer:\n  lr: 0.1\ntraining:\n  seed: 1\noptimizer:\n  min_lr: 0.01\n"
    with pytest.raises(DuplicateKeyError, match=r"'optimizer' is written twice .* line 1 and line 5"):
        load_yaml(text)


def test_a_nested_key_written_twice_is_refused():
    with pytest.raises(DuplicateKeyError, match=r"'lr' .* line 2 and line 3"):
        load_yaml("optimizer:\n  lr: 0.1\n  lr: 0.2\n")


def test_a_merge_key_may_be_overridden():
    assert load_yaml("base: &b {x: 1, y: 2}\nrun:\n  <<: *b\n  x: 3\n")["run"] == {"x": 3, "y": 2}


_keys = st.text("abcdefgh", min_size=1, max_size=4)
_values = st.one_of(st.integers(), st.booleans(), st.text("xyz", max_size=3))


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(_keys, st.one_of(_values, st.dictionaries(_keys, _values, max_size=3)), max_size=5))
def test_what_has_no_duplicate_reads_as_safe_load(tree):
    text = yaml.safe_dump(tree)
    assert load_yaml(text) == yaml.safe_load(text)


def test_a_config_file_with_a_duplicate_is_refused_naming_the_file(tmp_path):
    from megatron_biglm.config import ConfigError, load_config

    path = tmp_path / "run.yaml"
    path.write_text("optimizer:\n  lr: 0.001\noptimizer:\n  min_lr: 0.0001\n")
    with pytest.raises(ConfigError, match=rf"config file {path}: key 'optimizer' is written twice"):
        load_config(str(path))
