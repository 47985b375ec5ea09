"""Corpus encoding throughput (passages/s): our evaluation path vs a plain AutoModel loop.

Both encode the same passages (the stdlib docstring corpus, repeated to `--passages`) with the
same model: a randomly initialised EuroBERT (our HF export's architecture) wrapped by
`build_st_directory` as `to-st` wraps a checkpoint. "ours" is what `python -m megatron_biglm.cli.eval_retrieval`
runs for that directory (`SentenceTransformerEncoder.encode_passages`: sentence-transformers
sorts by length, so batches carry little padding); "plain" is the usual loop: batches in
corpus order, `AutoModel(**tokenizer(batch, padding=True))`, masked mean pooling,
normalisation. The two outputs are checked to agree, so the comparison is like for like.

    python -m benchmarks retrieval [--passages 2000] [--batch-size 32] [--layers 4] [--hidden 256]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def _model_dir(tmp: Path, layers: int, hidden: int) -> Path:
    from transformers import AutoTokenizer, EuroBertConfig, EuroBertModel

    from megatron_biglm.data.tokenizer import train_bpe_tokenizer
    from megatron_biglm.finetune.retrieval.stdlib_set import docstring_pairs

    texts = tmp / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": p["query"] + " " + p["passage"]}) + "\n"
                             for p in docstring_pairs()))
    tok_dir = train_bpe_tokenizer([str(texts)], 4096, tmp / "tok")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(0)
    config = EuroBertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                            intermediate_size=hidden * 3, max_position_embeddings=512,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id)
    hf = tmp / "hf"
    EuroBertModel(config).eval().save_pretrained(hf)
    tok.save_pretrained(hf)
    return hf


def plain_loop(hf_dir, texts, batch_size: int) -> torch.Tensor:
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(hf_dir), AutoModel.from_pretrained(hf_dir).eval()
    out = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tok(texts[start:start + batch_size], padding=True, truncation=True, max_length=512,
                      return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--passages", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    args = p.parse_args(argv)
    from megatron_biglm.export.sentence_transformers_dir import build_st_directory
    from megatron_biglm.finetune.retrieval.encoders import SentenceTransformerEncoder
    from megatron_biglm.finetune.retrieval.stdlib_set import docstring_pairs

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        hf = _model_dir(tmp, args.layers, args.hidden)
        st_dir = build_st_directory(hf, tmp / "st", prompts={"query": "", "passage": ""})
        corpus = [p["passage"] for p in docstring_pairs()]
        texts = (corpus * (args.passages // len(corpus) + 1))[:args.passages]
        encoder = SentenceTransformerEncoder(st_dir)
        encoder.encode_passages(texts[:64])  # warm-up
        t0 = time.perf_counter()
        ours = encoder.encode_passages(texts, batch_size=args.batch_size)
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        plain = plain_loop(hf, texts, args.batch_size)
        t_plain = time.perf_counter() - t0
    diff = float((ours - plain).abs().max())
    print(f"model: EuroBERT {args.layers} layers x {args.hidden} hidden (random), {len(texts)} passages, "
          f"batch {args.batch_size}, threads {torch.get_num_threads()}")
    print(f"ours (eval_retrieval path): {len(texts) / t_ours:8.1f} passages/s ({t_ours:.1f} s)")
    print(f"plain AutoModel loop:       {len(texts) / t_plain:8.1f} passages/s ({t_plain:.1f} s)")
    print(f"speed-up {t_plain / t_ours:.2f}x; max |ours - plain| = {diff:.2e}")
    return 0 if diff < 1e-4 else 1
