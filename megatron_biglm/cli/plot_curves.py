"""Plot training/validation loss of one or more runs against step and tokens (PNG).

    python -m megatron_biglm.cli.plot_curves runs/a runs/b --labels raw mixed --out curves.png
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_biglm.training.curves import plot_runs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories (or metrics.jsonl files)")
    parser.add_argument("--labels", nargs="*", help="one label per run (default: directory names)")
    parser.add_argument("--out", "--output", dest="out", default="curves.png",
                        help="the PNG to write (--output is the same flag)")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    labels = args.labels or [Path(r).name if Path(r).is_dir() else Path(r).parent.name for r in args.runs]
    if len(labels) != len(args.runs):
        parser.error(f"{len(labels)} labels for {len(args.runs)} runs")
    if len(set(labels)) != len(labels):
        parser.error(f"labels must be distinct, got {labels}; pass --labels")
    out = plot_runs(dict(zip(labels, args.runs)), args.out, args.title)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
