"""`python -m megatron_biglm.cli.generate`: Mask-Predict generation from the command line.

    python -m megatron_biglm.cli.generate --model PATH --prompt "To be, or not to be" --length 16 --show-steps
    python -m megatron_biglm.cli.generate --model PATH --input prompts.jsonl --output out.jsonl --max-new-tokens 32

PATH is an HF export or a megatron checkpoint (`MaskPredictGenerator.from_pretrained`).
`--input` holds one prompt per line, as `{"prompt": "..."}` or a JSON string; `--output` gets one
JSON row per prompt, in input order (prompt, text, ids, confidence, iterations, finish_reason,
length, candidates, prompt_tokens_dropped; `steps` with --show-steps). Every `GenerationConfig`
field is a flag (`--top-k`, `--min-length`, ...), generated from the dataclass with its default;
`--set KEY=VALUE` names a field as the dataclass does (value parsed as JSON when it parses). Bad input (an empty prompt, an over-long prompt without `--overflow truncate_left`,
length 0, steps < 1, a tokenizer without a mask token, a length beam without a length, an
unknown option, an `--output` that is a directory) prints `error: ...` saying what to do and exits with status 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from megatron_biglm.common.config_flags import add_dataclass_flags, flag_values, parse_flags
from megatron_biglm.common.output_path import output_file_problem
from megatron_biglm.data.rows import json_lines
from megatron_biglm.generation.config import GenerationConfig, GenerationConfigError
from megatron_biglm.generation.output import render_canvas

EXIT_BAD_INPUT = 2


class BadInput(ValueError):
    """The command line or its input files cannot be used; the message says why."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF export directory or megatron checkpoint")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="one prompt")
    src.add_argument("--input", type=Path, help="prompts.jsonl: {\"prompt\": ...} or a string per line")
    p.add_argument("--output", type=Path, help="out.jsonl: one JSON row per prompt, in order")
    add_decoding_args(p)
    p.add_argument("--show-steps", action="store_true", help="print the canvas after every iteration")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--dtype", help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--length-buckets", default="auto",
                   help="round padded lengths up so compiled kernels see few shapes: auto "
                        "(multiples of 64 on GPU, off on CPU), off, pow2 or N")
    p.add_argument("--no-progress", action="store_true")
    return p


# Every GenerationConfig field is a flag (the dataclass declares names, types, choices and
# defaults once); `return_steps` is this command's --show-steps.
DECODING_FIELDS = tuple(f.name for f in dataclasses.fields(GenerationConfig) if f.name != "return_steps")
_DECODING_HELP = {
    "length": "exactly N tokens (no EOS cut)", "max_new_tokens": "decode N slots, cut at the first EOS",
    "steps": "Mask-Predict iterations T per block", "temperature": "0: greedy argmax",
    "until": "stop string (repeatable)", "confidence_threshold": "commit every slot at least this likely",
    "overflow": "a prompt too long for the model: refuse, or drop tokens from the left",
    "batch_invariant": "the same ids for a prompt alone or in any batch (slower)",
}


def add_decoding_args(p: argparse.ArgumentParser) -> None:
    """The Mask-Predict options (`config_from_args` reads them), generated from
    `GenerationConfig`: shared by every command that generates, so they are spelled, defaulted
    and checked the same everywhere."""
    add_dataclass_flags(p, GenerationConfig, DECODING_FIELDS, helps=_DECODING_HELP,
                        exclusive=[("length", "max_new_tokens")])
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a GenerationConfig field by name (repeatable; the value parsed as JSON when it parses)")


def config_from_args(args) -> GenerationConfig:
    values = {**flag_values(args, DECODING_FIELDS), "return_steps": bool(getattr(args, "show_steps", False))}
    for item in args.extra:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise BadInput(f"--set takes KEY=VALUE, got {item!r}")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    return GenerationConfig.from_dict(values)


def read_prompts(path: Path) -> list[str]:
    if not path.is_file():
        raise BadInput(f"--input {path} does not exist")
    prompts = []
    for n, row in json_lines(path, BadInput, 'write one {"prompt": ...} object per line'):
        prompt = row.get("prompt") if isinstance(row, dict) else row
        if not isinstance(prompt, str):
            raise BadInput(f"{path}:{n} has no string \"prompt\"; write one {{\"prompt\": ...}} "
                           "object (or a JSON string) per line")
        prompts.append(prompt)
    if not prompts:
        raise BadInput(f"--input {path} holds no prompts")
    return prompts


def main(argv: list[str] | None = None, *, stdout=None, stderr=None) -> int:
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    args = parse_flags(build_parser(), argv)  # exits with status 2 on bad flags
    try:
        if args.input is not None and args.output is None:
            raise BadInput("--input needs --output out.jsonl (one JSON row per prompt)")
        if args.batch_size < 1:
            raise BadInput(f"--batch-size must be >= 1, got {args.batch_size}")
        problem = output_file_problem(args.output)  # before the model loads and generates
        if problem:
            raise BadInput(problem)
        config = config_from_args(args)
        prompts = [args.prompt] if args.prompt is not None else read_prompts(args.input)
        outputs = _generate(args, config, prompts, stderr)
    except (BadInput, GenerationConfigError, ValueError, TypeError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=stderr)
        return EXIT_BAD_INPUT
    return _report(args, outputs, stdout, stderr)


def _generate(args, config, prompts, stderr):
    from tqdm.auto import tqdm

    from megatron_biglm.generation.generator import MaskPredictGenerator

    generator = MaskPredictGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                                     length_buckets=args.length_buckets)
    batches = -(-len(prompts) // (1 if config.batch_invariant else args.batch_size))
    bar = tqdm(total=batches, desc="generating (batches)", file=stderr,
               disable=args.no_progress or len(prompts) == 1)

    def progress(done, total):
        bar.update(1)

    outputs = generator.generate(prompts, config, batch_size=args.batch_size, progress=progress)
    bar.close()
    if args.show_steps:
        mask_id = generator.adapter.special.mask_id
        for out in outputs:
            print(f"--- {out.prompt!r}", file=stderr)
            for s in out.steps or []:
                print(f"block {s.block} iter {s.iteration}: "
                      f"{render_canvas(generator.tokenizer, s.ids, mask_id)}", file=stderr)
    return outputs


def _report(args, outputs, stdout, stderr) -> int:
    dropped = [o.prompt_tokens_dropped for o in outputs]
    if any(dropped):
        print(f"note: {sum(1 for d in dropped if d)} prompt(s) truncated from the left "
              f"({sum(dropped)} tokens dropped) to fit the model", file=stderr)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("w", encoding="utf-8") as f:
            for out in outputs:
                f.write(json.dumps(out.to_json(), ensure_ascii=False) + "\n")
        print(f"wrote {len(outputs)} rows to {args.output}", file=stderr)
    else:
        for out in outputs:
            print(out.prompt + out.text, file=stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
