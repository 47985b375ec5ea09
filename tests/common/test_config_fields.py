"""common.config_fields: the one coercion and unknown-key mechanism of every config dataclass."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

import pytest

from megatron_biglm.common.config_fields import ConfigError, build_dataclass, coerce


@dataclass
class Inner:
    rate: float = 0.1
    mode: Literal["a", "b"] = "a"


@dataclass
class Outer:
    steps: int
    inner: Inner = field(default_factory=Inner)
    limit: Optional[int] = None
    either: Union[int, str] = 0
    ranges: tuple[float, float] = (0.0, 1.0)
    names: list[str] = field(default_factory=list)
    flag: bool = False


class SectionError(ConfigError):
    pass


def test_values_are_coerced_to_the_annotated_types():
    built = build_dataclass(Outer, {"steps": "2e3", "inner": {"rate": "6e-4", "mode": "b"}, "limit": "null",
                                    "either": "x", "ranges": [0, "0.5"], "names": [1, "b"], "flag": "yes"},
                            "run")
    assert built == Outer(steps=2000, inner=Inner(rate=6e-4, mode="b"), limit=None, either="x",
                          ranges=(0.0, 0.5), names=["1", "b"], flag=True)
    assert build_dataclass(Outer, {"steps": 1, "inner": None}).inner == Inner()  # empty section: defaults
    assert coerce(2**60, int, "k") == 2**60 and coerce("7", Optional[int], "k") == 7


@pytest.mark.parametrize("data,fragment", [
    ({"steps": 1.5}, r"'run.steps': expected int \(a whole number\)"),
    ({"steps": "many"}, "'run.steps': expected int, got 'many': it must be a number"),
    ({"steps": True}, "'run.steps': expected int"),
    ({"steps": 1, "inner": {"mode": "c"}}, r"'run.inner.mode': 'c' is not one of \['a', 'b'\]"),
    ({"steps": 1, "inner": 3}, "config section 'run.inner' must be a mapping"),
    ({"steps": 1, "ranges": [1, 2, 3]}, "'run.ranges': expected 2 values"),
    ({"steps": 1, "flag": "maybe"}, "expected true/false"),
    ({}, r"config section 'run' is missing required key\(s\): \['steps'\]"),
])
def test_wrong_values_name_the_key(data, fragment):
    with pytest.raises(ConfigError, match=fragment):
        build_dataclass(Outer, data, "run")


def test_unknown_keys_name_section_key_close_match_and_valid_keys():
    with pytest.raises(SectionError) as err:  # the caller's error class, still a ConfigError
        build_dataclass(Outer, {"steps": 1, "inner": {"rtae": 1}}, "run", error=SectionError)
    assert str(err.value) == ("unknown config key 'run.inner.rtae' (did you mean 'rate'?); "
                              "valid keys in run.inner: rate, mode")
    with pytest.raises(ConfigError, match=r"^unknown Outer keys \['lmit', 'zzz'\] \(did you mean 'limit' for "
                                          r"'lmit'\?\); valid keys in the top level: steps, inner"):
        build_dataclass(Outer, {"lmit": 1, "zzz": 2}, headline="unknown Outer keys {keys}")
