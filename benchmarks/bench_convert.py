"""Peak memory of checkpoint conversion relative to the model's size: streaming vs naive.

The claim under test: `to_hf` never holds the whole model twice (it holds at most one
safetensors shard plus one layer slice, so its peak follows the shard size, not the model),
and `from_hf` holds one rank's model chunk plus one tensor (plus what megatron's own
`dist_checkpointing.save` stages). Each conversion runs in a fresh child process. Reported:
the peak of anonymous memory (RssAnon, sampled every 2 ms) above the level after imports, as
MiB and as a multiple of the model's fp32 size, and the peak RSS (VmHWM after a reset through
/proc/self/clear_refs), which also counts page-cache pages of memory-mapped weight files.
Children run with a 64 KiB glibc mmap threshold, so freed blocks leave RSS.

  import             `from_hf` at TP=1, PP=1 (builds the one model chunk it saves)
  export streaming   `to_hf`, once with small and once with larger shards
  export naive       the usual exporter, the baseline: read the whole checkpoint into a dict,
                     map it to an HF dict, build `EuroBertForMaskedLM`, `save_pretrained`

The model is random (memory does not depend on the values), written tensor by tensor.

    python -m benchmarks convert [--layers 8] [--hidden 1024] [--ffn 2816] [--vocab 32000]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(re.search(rf"{field}:\s+(\d+)", fh.read()).group(1)) * 1024


class AnonPeak:
    """Samples RssAnon in a thread: the kernel keeps no peak for anonymous memory alone."""

    def __enter__(self):
        self.base = self.peak = _rss_bytes("RssAnon")
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop:
            self.peak = max(self.peak, _rss_bytes("RssAnon"))
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes("RssAnon"))


def write_source(folder: Path, args) -> int:
    """A random EuroBERT directory (+ a word-level tokenizer), streamed; returns its parameters."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from megatron_biglm.export import BiGLMShape, eurobert_config, hf_tensor_shapes, save_safetensors_stream

    specials = ["<s>", "</s>", "<pad>", "<mask>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(args.vocab - len(specials))])}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")),
                                        bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        mask_token="<mask>", unk_token="<unk>")
    heads = args.hidden // 64
    shape = BiGLMShape(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=heads,
                       num_query_groups=max(1, heads // 4), head_dim=64, ffn_hidden_size=args.ffn,
                       vocab_size=args.vocab)
    shapes = hf_tensor_shapes(shape)
    gen = torch.Generator().manual_seed(0)
    save_safetensors_stream(folder, ((n, torch.randn(s, generator=gen) * 0.02) for n, s in shapes.items()))
    eurobert_config(shape, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=2048,
                    mask_token_id=3, pad_token_id=2, bos_token_id=0, eos_token_id=1).save_pretrained(folder)
    tokenizer.save_pretrained(str(folder))
    return sum(torch.Size(s).numel() for s in shapes.values())


def child(mode: str, src: str, dst: str, shard_bytes: int) -> dict:
    """Run one conversion in this (fresh) process; report peak RSS above the post-import level."""
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from megatron_biglm.export.convert_from_hf import from_hf
    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.export.hf_config import shape_from_biglm_config
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.export.weight_mapping import megatron_to_hf

    if mode == "import":  # megatron and the CPU shims are imported by the conversion itself;
        import megatron.core  # noqa: F401  import them first so they are not counted
        from megatron_biglm.model.standalone import init_single_process

        init_single_process(1, 1)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = _rss_bytes("VmRSS")
    start = time.perf_counter()
    with AnonPeak() as anon:
        if mode.startswith("export-stream"):
            to_hf(src, dst, max_shard_bytes=shard_bytes, progress=False)
        elif mode == "export-naive":
            from transformers import AutoTokenizer, EuroBertForMaskedLM

            from megatron_biglm.export.hf_config import hf_config_from_biglm

            ckpt = open_checkpoint(src)
            weights = ckpt.weights()
            full = {name: weights[name] for name in weights}
            hf = dict(megatron_to_hf(full, shape_from_biglm_config(ckpt.model_config)))
            tokenizer = AutoTokenizer.from_pretrained(ckpt.run_config.data.tokenizer)
            model = EuroBertForMaskedLM(hf_config_from_biglm(ckpt.model_config, tokenizer))
            model.load_state_dict(hf, strict=False)
            model.save_pretrained(dst)
        else:
            from_hf(src, dst, progress=False)
    return {"seconds": time.perf_counter() - start, "anon": anon.peak - anon.base,
            "hwm": _rss_bytes("VmHWM") - base}


def run_child(mode: str, src: Path, dst: Path, shard_bytes: int, threads: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(threads),
               HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_convert", "--child", mode, str(src), str(dst),
                           str(shard_bytes)], capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks convert", description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--ffn", type=int, default=2816)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-mib", type=int, default=256, help="the larger shard size")
    parser.add_argument("--small-shard-mib", type=int, default=32, help="the smaller shard size")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.child[2], int(args.child[3]))))
        return 0
    small, large = args.small_shard_mib * 2**20, args.shard_mib * 2**20
    with tempfile.TemporaryDirectory(prefix="bench_convert_") as tmp:
        tmp = Path(tmp)
        params = write_source(tmp / "hf", args)
        model_bytes = params * 4
        print(f"model: {params / 1e6:.1f}M parameters, {model_bytes / 2**20:.0f} MiB in fp32 "
              f"({args.layers} layers, hidden {args.hidden}, FFN {args.ffn}, vocab {args.vocab}); CPU, "
              f"{args.threads} threads", flush=True)
        rows = [("import (from_hf, TP=1)", run_child("import", tmp / "hf", tmp / "ckpt", large, args.threads)),
                (f"export streaming ({args.small_shard_mib} MiB shards)",
                 run_child("export-stream", tmp / "ckpt", tmp / "out_small", small, args.threads)),
                (f"export streaming ({args.shard_mib} MiB shards)",
                 run_child("export-stream", tmp / "ckpt", tmp / "out_large", large, args.threads)),
                ("export naive (baseline)", run_child("export-naive", tmp / "ckpt", tmp / "out_naive", large,
                                                      args.threads))]
    print(f"{'conversion':34s} {'anon MiB':>9s} {'x model':>8s} {'RSS MiB':>8s} {'seconds':>8s}")
    for name, r in rows:
        print(f"{name:34s} {r['anon'] / 2**20:9.0f} {r['anon'] / model_bytes:8.2f} {r['hwm'] / 2**20:8.0f} "
              f"{r['seconds']:8.1f}")
    stream, naive = rows[1][1]["anon"], rows[3][1]["anon"]
    print(f"peak anonymous memory, naive / streaming export ({args.small_shard_mib} MiB shards): "
          f"{naive / max(stream, 1):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
