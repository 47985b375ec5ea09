"""Flags generated from a config dataclass (common/config_flags.py) and the commands built on it.

A command's flags must carry the dataclass's own defaults and conversions (so the config a
command builds from no flags is the dataclass's default), and a mistyped flag is refused with
the same did-you-mean hint as a mistyped config key.
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
from typing import Literal

import pytest
import torch

from megatron_biglm.common.config_fields import build_dataclass
from megatron_biglm.common.config_flags import add_dataclass_flags, flag_values, parse_flags
from megatron_biglm.generation import GenerationConfig


@dataclasses.dataclass(frozen=True)
class _Toy:
    mode: Literal["fast", "exact"] = "exact"
    limit: int | None = None
    rate: float = 0.5
    tags: tuple[str, ...] = ("a",)
    strict: bool = False


def _toy_parser():
    parser = argparse.ArgumentParser(prog="toy")
    names = add_dataclass_flags(parser, _Toy, [f.name for f in dataclasses.fields(_Toy)])
    return parser, names


def test_no_flags_give_the_dataclass_defaults_and_flags_are_converted_by_config_fields():
    parser, names = _toy_parser()
    assert build_dataclass(_Toy, flag_values(parse_flags(parser, []), names)) == _Toy()
    args = parse_flags(parser, ["--mode", "fast", "--limit", "3", "--rate", "2e-1", "--tags", "x", "--tags", "y",
                                "--strict"])
    assert build_dataclass(_Toy, flag_values(args, names)) == _Toy("fast", 3, 0.2, ("a", "x", "y"), True)
    assert parse_flags(parser, ["--no-strict"]).strict is False


@pytest.mark.parametrize("argv, message", [
    (["--limit", "2.5"], "expected int (a whole number)"),   # config_fields' own message
    (["--mode", "quick"], "not one of"),
    (["--limitt", "3"], "did you mean '--limit'"),
    (["--rte=3"], "did you mean '--rate'"),
])
def test_bad_flags_are_refused_with_config_fields_messages(argv, message, capsys):
    parser, _ = _toy_parser()
    with pytest.raises(SystemExit) as exit_info:
        parse_flags(parser, argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("command, required", [
    ("generate", ["--model", "m", "--prompt", "p"]),
    ("eval_multitask", ["--model", "m", "--genset", "g.jsonl"]),
])
def test_every_decoding_flag_defaults_to_the_generation_config_default(command, required):
    import importlib

    from megatron_biglm.cli.generate import DECODING_FIELDS, config_from_args

    parser = importlib.import_module(f"megatron_biglm.cli.{command}").build_parser()
    defaults = {f.name: f.default for f in dataclasses.fields(GenerationConfig)}
    assert set(DECODING_FIELDS) == set(defaults) - {"return_steps"}
    for name in DECODING_FIELDS:
        default = parser.get_default(name)
        assert (tuple(default) if isinstance(default, list) else default) == defaults[name], name
    assert config_from_args(parse_flags(parser, required)) == GenerationConfig()
    args = parse_flags(parser, [*required, "--min-length", "2", "--max-new-tokens", "4", "--until", "\n",
                                "--blocks", "cached", "--batch-invariant"])
    assert config_from_args(args) == GenerationConfig(min_length=2, max_new_tokens=4, until=("\n",),
                                                      blocks="cached", batch_invariant=True)


@pytest.mark.parametrize("argv, message", [
    (["--top-kk", "3"], "did you mean '--top-k'"),
    (["--remask", "greedy"], "not one of"),
    (["--length", "3", "--max-new-tokens", "3"], "not allowed with argument"),
])
def test_generate_refuses_a_mistyped_or_bad_flag_before_loading_anything(argv, message, capsys):
    from megatron_biglm.cli.generate import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "/nonexistent", "--prompt", "p", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_loop_parts_meet_their_protocols():
    """What run/train.py hands the loop satisfies loop_parts' Protocols, and both backends'
    step and evaluation take exactly the parameters the Protocols name."""
    from megatron_biglm.training import deepspeed_backend, step
    from megatron_biglm.training.loop_parts import (Evaluate, MetricsSink, NonFiniteCheck, StepOutcome, StopSignal,
                                                     TrainStep)
    from megatron_biglm.training.metrics import MetricsLogger
    from megatron_biglm.training.nonfinite import NonFiniteGuard
    from megatron_biglm.training.signals import GracefulStop

    assert isinstance(NonFiniteGuard(3), NonFiniteCheck)
    assert isinstance(GracefulStop(), StopSignal)
    assert isinstance(MetricsLogger("unused", enabled=False, total_steps=1), MetricsSink)
    assert not isinstance(object(), NonFiniteCheck)
    result = step.StepResult(torch.zeros(2), None, step.StepStats())
    assert isinstance(result, StepOutcome) and not isinstance(object(), StepOutcome)

    def parameters(fn):
        return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values() if p.name != "self"]

    for protocol, name in ((TrainStep, "train_step"), (Evaluate, "evaluate")):
        for backend in (step, deepspeed_backend):
            assert parameters(getattr(backend, name)) == parameters(protocol.__call__), (backend.__name__, name)
