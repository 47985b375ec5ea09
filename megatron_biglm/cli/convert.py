"""`python -m megatron_biglm.cli.convert`: megatron-biglm checkpoints <-> Hugging Face directories.

    to-hf   --checkpoint CKPT_DIR --output HF_DIR [--tokenizer DIR] [--dtype bf16] [--max-shard-size 2GB] [--no-verify]
    from-hf --hf HF_DIR --output CKPT_DIR [--tp N] [--pp M]
    to-st   --checkpoint CKPT_DIR --output ST_DIR [--pooling mean|cls|last] [--no-normalize]

Exit status 0 on success (the verified summary is printed), 1 on a refused input (the
message says what is wrong and what to do), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import logging
import re
import sys
import warnings

from megatron_biglm.cli import refuse

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """'2GB', '500MiB', '100000' -> bytes."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else None
    size = int(float(match.group(1)) * _UNITS[unit]) if match and unit in _UNITS else 0
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size like 2GB, 500MiB or 100000")
    return size


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m megatron_biglm.cli.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    to_hf = sub.add_parser("to-hf", help="megatron-biglm checkpoint -> HF directory (native EuroBERT)")
    to_hf.add_argument("--checkpoint", required=True,
                       help="iter_N folder, a checkpoint dir with `latest`, or a run dir")
    to_hf.add_argument("--output", required=True, help="new HF model directory")
    to_hf.add_argument("--tokenizer", help="tokenizer dir to ship (default: the run's data.tokenizer)")
    to_hf.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="cast weights (default: as saved)")
    to_hf.add_argument("--no-verify", action="store_true",
                       help="skip the CRC-32 check of every stored item (storage you trust)")
    to_hf.add_argument("--max-shard-size", type=parse_size, default="2GiB",
                       help="largest safetensors shard (default 2GiB)")
    from_hf = sub.add_parser("from-hf", help="HF directory -> megatron-biglm checkpoint (weights only)")
    from_hf.add_argument("--hf", required=True, help="HF model directory (ours or a native EuroBERT)")
    from_hf.add_argument("--output", required=True, help="new checkpoint directory")
    from_hf.add_argument("--tp", type=int, default=1, help="tensor-parallel size to save at")
    from_hf.add_argument("--pp", type=int, default=1, help="pipeline-parallel size to save at")
    from_hf.add_argument("--no-verify", action="store_true", help=argparse.SUPPRESS)  # spawned ranks
    to_st = sub.add_parser("to-st", help="megatron-biglm checkpoint -> sentence-transformers directory")
    to_st.add_argument("--checkpoint", required=True, help="iter_N folder, a checkpoint dir or a run dir")
    to_st.add_argument("--output", required=True, help="new sentence-transformers directory")
    to_st.add_argument("--pooling", choices=["mean", "cls", "first", "last"], default=None,
                       help="pooling over the valid tokens (default: a contrastive fine-tune's own, else mean)")
    to_st.add_argument("--no-normalize", action="store_true", help="no L2 normalisation module")
    to_st.add_argument("--tokenizer", help="tokenizer dir to ship (default: the run's data.tokenizer)")
    for p in (to_hf, from_hf, to_st):
        p.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def refusal_types() -> tuple:
    """The errors that mean 'this input cannot be converted' (exit 1, message only)."""
    from megatron_biglm.checkpoint.dirs import CheckpointError
    from megatron_biglm.checkpoint.dist_reader import DistCheckpointReadError
    from megatron_biglm.config import ConfigError
    from megatron_biglm.data.tokenizer import TokenizerLoadError
    from megatron_biglm.data.tokenizer_check import TokenizerMismatch
    from megatron_biglm.export.conversion_summary import VerificationError
    from megatron_biglm.export.convert_to_hf import ConversionError
    from megatron_biglm.export.hf_config import UnsupportedArchitecture
    from megatron_biglm.export.hf_files import CheckpointFileError
    from megatron_biglm.export.weight_mapping import WeightMappingError
    from megatron_biglm.model import ModelConfigError

    return (CheckpointError, CheckpointFileError, DistCheckpointReadError, WeightMappingError,
            UnsupportedArchitecture, TokenizerMismatch, TokenizerLoadError, ConversionError,
            VerificationError, ConfigError, ModelConfigError)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    refused = refusal_types()
    try:
        if args.command == "to-hf":
            from megatron_biglm.export.convert_to_hf import to_hf

            summary = to_hf(args.checkpoint, args.output, tokenizer=args.tokenizer, dtype=args.dtype,
                            max_shard_bytes=args.max_shard_size, progress=not args.quiet,
                            verify=not args.no_verify)
        elif args.command == "to-st":
            from megatron_biglm.export.sentence_transformers_dir import to_st

            out = to_st(args.checkpoint, args.output, pooling=args.pooling, normalize=False if args.no_normalize else None,
                        tokenizer=args.tokenizer, progress=not args.quiet)
            print(f"wrote sentence-transformers model {out} (pooling {args.pooling or 'as trained'}, "
                  f"{'no ' if args.no_normalize else ''}normalisation)", flush=True)
            summary = None
        else:
            from megatron_biglm.export.convert_from_hf import from_hf

            summary = from_hf(args.hf, args.output, tp=args.tp, pp=args.pp, progress=not args.quiet,
                              verify=not args.no_verify)
    except (*refused, FileExistsError) as exc:
        return refuse(exc, 1)
    if summary is not None:
        print(summary.format(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
