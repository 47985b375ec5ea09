"""What the checkpoint verifier (checkpoint/verify.py) costs, as a fraction of the load it guards.

A model of the given shape is trained for one step on the sample corpus and saved (model and
Adam state, torch_dist). Then, each `--repeat` times, best taken:

  verify        verify_checkpoint: manifest sizes + the CRC-32 of every stored item
  eval load     inference.loading.load_megatron_checkpoint(verify=False): build at TP=1 and load
  resume start  train() resuming that checkpoint with checkpoint.verify=false and no step left
                to run: process group, datasets, model, optimizer, load (the whole start-up)

and prints each time and verify / (load + verify). The page cache is warm after the first read,
as it is on a node that just wrote or read the checkpoint; a cold read off network storage is
I/O-bound for both the load and the check.

    python -m benchmarks checkpoint_verify [--layers 4] [--hidden 512] [--ffn 1536] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _data(out: Path):
    from megatron_biglm.data import sample_corpus
    from megatron_biglm.data.preprocess import preprocess
    from megatron_biglm.data.tokenizer import load_tokenizer, train_bpe_tokenizer

    sample_corpus.write_jsonl(out / "c.jsonl", max_plays=2)
    tok = train_bpe_tokenizer([str(out / "c.jsonl")], 2048, out / "tok", json_keys=("text",))
    preprocess([str(out / "c.jsonl")], str(out / "shk"), load_tokenizer(str(tok)), json_keys=("text",),
               workers=1, append_eod=True)
    return str(tok), str(out / "shk_text_document")


def _overrides(args, tok, prefix, run: Path, steps: int) -> list[str]:
    over = {"run_dir": run, "model.preset": "tiny", "model.num_layers": args.layers,
            "model.hidden_size": args.hidden, "model.ffn_hidden_size": args.ffn, "model.vocab_size": 2048,
            "data.tokenizer": tok, "data.blend": f"['{prefix}']", "data.seq_length": 64,
            "schedule.style": "constant", "schedule.train_steps": steps, "schedule.warmup_steps": 0,
            "training.micro_batch_size": 2, "training.global_batch_size": 2, "training.precision": "fp32",
            "training.eval_interval": 0, "training.eval_iters": 0, "logging.tensorboard": False,
            "logging.progress": "plain", "logging.log_interval": 1, "checkpoint.save_interval": 1000,
            "checkpoint.save_at_end": steps == 1}
    return [f"{k}={v}" for k, v in over.items()]


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import logging
    logging.disable(logging.WARNING)

    from megatron_biglm.checkpoint.verify import verify_checkpoint
    from megatron_biglm.inference.loading import load_megatron_checkpoint
    from megatron_biglm.cli.train import train

    with tempfile.TemporaryDirectory(prefix="bench-verify-") as tmp:
        tmp = Path(tmp)
        tok, prefix = _data(tmp)
        run = tmp / "run"
        train(None, _overrides(args, tok, prefix, run, 1))
        ckpt = run / "checkpoints" / "iter_0000001"
        size = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        report = verify_checkpoint(ckpt)
        t_verify = _best(lambda: verify_checkpoint(ckpt), args.repeat)
        t_eval = _best(lambda: load_megatron_checkpoint(ckpt, verify=False), args.repeat)
        resume = _overrides(args, tok, prefix, run, 1) + ["checkpoint.verify=false", "checkpoint.save_at_end=false"]
        t_resume = _best(lambda: train(None, resume), args.repeat)
    result = {"shape": f"{args.layers}x{args.hidden} ffn {args.ffn} vocab 2048", "checkpoint_mb": round(size / 1e6, 1),
              "items": report.items, "verify_s": round(t_verify, 3),
              "verify_mb_per_s": round(size / 1e6 / t_verify, 1),
              "eval_load_s": round(t_eval, 3), "verify_fraction_of_eval_load": round(t_verify / (t_eval + t_verify), 3),
              "resume_start_s": round(t_resume, 3),
              "verify_fraction_of_resume_start": round(t_verify / (t_resume + t_verify), 3),
              "cpus": os.cpu_count()}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv[1:]))
