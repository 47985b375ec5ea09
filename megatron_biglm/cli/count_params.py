"""Print a BiGLM preset's parameter breakdown without allocating the model.

    python -m megatron_biglm.cli.count_params PRESET_OR_CONFIG [--set key=value ...]

PRESET_OR_CONFIG is a preset name (tiny, 136m, 360m, 1p3b, 3p5b, trial_124m) or a preset YAML
path. The last line of output is the total as a bare integer, for scripts.
"""
from __future__ import annotations

import argparse
import sys

import yaml

from megatron_biglm.cli import refuse
from megatron_biglm.model.config import ModelConfigError
from megatron_biglm.model.param_count import count_params, param_breakdown
from megatron_biglm.model.presets import load_preset


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", help="preset name or YAML path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model field, e.g. --set vocab_size=32000")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    try:
        cfg = load_preset(args.preset, overrides)
    except ModelConfigError as exc:
        return refuse(exc, 2)
    total = count_params(cfg)
    print(f"preset {cfg.name}: {cfg.num_layers} layers, hidden {cfg.hidden_size}, "
          f"{cfg.num_attention_heads} heads / {cfg.query_groups} kv groups, ffn {cfg.ffn_hidden_size}, "
          f"vocab {cfg.vocab_size} (padded {cfg.padded_vocab_size})")
    for name, n in param_breakdown(cfg).items():
        print(f"  {name:<40s} {n:>15,d}  {100.0 * n / total:5.1f} %")
    print(f"  {'total':<40s} {total:>15,d}  ({total / 1e6:.1f}M)")
    print(total)
    return 0


if __name__ == "__main__":
    sys.exit(main())
