"""`python -m megatron_biglm.cli.kernels --config RUN.yaml [key=value ...]`: print the
kernels and versions a run of this config gets on this machine (model/kernels.py), the same
report the training entry prints at start. Exits 2 with the reason, e.g. the package to pip
install, when the config names a kernel that is not installed. launch/common.sh runs it on
the first node before starting the job."""
from __future__ import annotations

import argparse
import sys

from megatron_biglm.cli import refuse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="run config YAML (see examples/configs/)")
    parser.add_argument("overrides", nargs="*", help="section.key=value overrides")
    args = parser.parse_args(argv)

    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.training.build import kernels, resolve_precision

    try:
        cfg = load_config(args.config, args.overrides)
        print(kernels(cfg.model.resolved, resolve_precision(cfg.training)), flush=True)
    except ConfigError as exc:
        return refuse(exc, 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
