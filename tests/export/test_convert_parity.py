"""Conversion against real megatron runs: trained checkpoints at (TP, PP) ∈ {(1,1), (2,1), (1,2)}
export to HF with logits equal to the megatron model's; imports at TP=2 / PP=2 load back.

Megatron runs in torchrun workers (process groups and CPU shims stay out of pytest); the HF
side runs here. The reference logits are those of the model megatron loads from the trained
checkpoint in the layout it was trained in, on one fixed batch, with and without the split.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from convert_fixtures import fixed_batch, hf_state, write_random_eurobert
from megatron_biglm.export.convert_from_hf import from_hf
from megatron_biglm.export.convert_to_hf import to_hf
from megatron_biglm.export.split_attention import forward_with_split
from train_fixtures import TrainData, tiny_overrides, train_data  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[2]
PARITY_TOL = 1e-5
TRAIN_STEPS = 4


def _torchrun(target: str, nproc: int, **kwargs) -> list:
    sys.path.insert(0, str(REPO / "tests" / "fixtures"))
    from torchrun_util import run_function

    res = run_function(f"tests/export/test_convert_parity.py:{target}", nproc=nproc, kwargs=kwargs, timeout=240)
    return [res.check().results[r] for r in range(nproc)]


def _reference_logits(checkpoint: str, ref_path: str, vocab: int) -> None:
    """Load `checkpoint` into this layout's model chunk and save the last stage's logits."""
    from megatron.core import parallel_state as ps

    from convert_fixtures import build_megatron_model, megatron_logits
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.checkpoint.weights_only import load_model_weights

    model = build_megatron_model(open_checkpoint(checkpoint).model_config)
    load_model_weights(checkpoint, model)
    ids, split = fixed_batch(vocab)
    full, with_split = megatron_logits(model, ids, None), megatron_logits(model, ids, split)
    if ps.is_pipeline_last_stage() and ps.get_tensor_model_parallel_rank() == 0:
        torch.save({"full": full[..., :vocab], "split": with_split[..., :vocab]}, ref_path)


def train_worker(tokenizer: str, prefix: str, run_dir: str, tp: int, pp: int, ref_path: str) -> dict:
    """Train the tiny preset briefly at (tp, pp), then compute reference logits from its checkpoint."""
    from megatron_biglm.model.standalone import init_single_process
    from megatron_biglm.cli.train import train

    overrides = tiny_overrides(TrainData(tokenizer, prefix), Path(run_dir), steps=TRAIN_STEPS,
                               **{"parallelism.tensor_model_parallel_size": tp,
                                  "parallelism.pipeline_model_parallel_size": pp})
    result = train(None, overrides)
    init_single_process(tp, pp)  # train() tore its parallel state down
    from train_fixtures import VOCAB

    _reference_logits(result.checkpoint, ref_path, VOCAB)
    return {"checkpoint": result.checkpoint, "consumed_samples": result.consumed_samples,
            "last_loss": result.last_loss}


def load_worker(checkpoint: str, tp: int, pp: int, ref_path: str, vocab: int) -> dict:
    """Load a (converted) checkpoint at (tp, pp) and save its logits."""
    from megatron_biglm.model.standalone import init_single_process

    init_single_process(tp, pp)
    _reference_logits(checkpoint, ref_path, vocab)
    return {}


def _hf_logits(model_dir: Path, attn: str, vocab: int):
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(model_dir), attn_implementation=attn).eval()
    ids, split = fixed_batch(vocab)
    with torch.no_grad():
        return model(input_ids=ids).logits, forward_with_split(model, ids, split).logits


def _hf_params(model_dir: Path) -> int:
    return sum(t.numel() for t in hf_state(model_dir).values())


def _check_fill_mask(hf_dir: Path) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    text = f"To be, or not to be, that is the {tokenizer.mask_token}."
    preds = pipeline("fill-mask", model=str(hf_dir), top_k=5)(text)
    model = AutoModelForMaskedLM.from_pretrained(str(hf_dir)).eval()
    enc = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits[0, enc["input_ids"][0].tolist().index(tokenizer.mask_token_id)]
    top = logits.softmax(-1).topk(5)
    assert [p["token"] for p in preds] == top.indices.tolist()
    assert [p["score"] for p in preds] == pytest.approx(top.values.tolist(), abs=1e-6)
    assert all(p["sequence"].startswith("To be, or not to be") for p in preds)


@pytest.mark.slow
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2)], ids=["tp1pp1", "tp2pp1", "tp1pp2"])
def test_trained_checkpoint_exports_with_logit_parity(train_data, tmp_path, tp, pp):  # noqa: F811
    from train_fixtures import VOCAB

    ref_path = tmp_path / "ref.pt"
    res = _torchrun("train_worker", tp * pp, tokenizer=train_data.tokenizer, prefix=train_data.prefix,
                    run_dir=str(tmp_path / "run"), tp=tp, pp=pp, ref_path=str(ref_path))[0]
    summary = to_hf(tmp_path / "run", tmp_path / "hf", progress=False)  # the run dir: latest is found
    assert summary.max_abs_diff == 0.0 and summary.source.endswith(f"iter_{TRAIN_STEPS:07d}")
    ref = torch.load(ref_path)
    # not vacuous: logits of order 1 (a 4-step model is near its init) that the split changes
    assert ref["full"].abs().max() > 0.5 and (ref["full"] - ref["split"]).abs().max() > 1e-3
    for attn in ("sdpa", "eager"):
        full, with_split = _hf_logits(tmp_path / "hf", attn, VOCAB)
        assert (full - ref["full"]).abs().max() <= PARITY_TOL, (attn, "full")
        assert (with_split - ref["split"]).abs().max() <= PARITY_TOL, (attn, "split")
    card = (tmp_path / "hf" / "README.md").read_text()
    seq = 64  # tiny_overrides' data.seq_length
    assert res["consumed_samples"] == TRAIN_STEPS * 8
    assert f"| training tokens | {res['consumed_samples'] * seq:,} (consumed samples × sequence length) |" in card
    assert "| preset | `tiny` |" in card and '"variant": "biglm"' in card and '"alpha": 0.2' in card
    if (tp, pp) == (1, 1):
        _check_fill_mask(tmp_path / "hf")


@pytest.mark.slow
def test_import_at_tp2_loads_in_megatron_with_the_hf_logits(tokenizer_dir, tmp_path):
    src = write_random_eurobert(tmp_path / "src", vocab_size=400, tokenizer_dir=tokenizer_dir, seed=5)
    proc = subprocess.run(  # the CLI, from one process: it starts the 2 ranks itself
        [sys.executable, "-m", "megatron_biglm.cli.convert", "from-hf", "--hf", str(src),
         "--output", str(tmp_path / "ckpt"), "--tp", "2"], capture_output=True, text=True, timeout=240,
        env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "verified by re-reading the output: max |diff| = 0\n" in proc.stdout
    assert f"parameters: source {_hf_params(src):,}, output {_hf_params(src) + 112 * 64:,}" in proc.stdout
    state = json.loads((tmp_path / "ckpt" / "iter_0000000" / "train_state.json").read_text())
    assert state["weights_only"] and (state["tp"], state["pp"]) == (2, 1)
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(tmp_path / "ckpt" / "iter_0000000" / "dist")).read_metadata()
    chunks = saved.state_dict_metadata["embedding.word_embeddings.weight"].chunks  # one per TP rank
    boxes = sorted((tuple(c.offsets), tuple(c.sizes)) for c in chunks)
    assert boxes == [((0, 0), (256, 64)), ((256, 0), (256, 64))]
    _torchrun("load_worker", 2, checkpoint=str(tmp_path / "ckpt"), tp=2, pp=1,
              ref_path=str(tmp_path / "ref.pt"), vocab=400)
    ref = torch.load(tmp_path / "ref.pt")
    full, with_split = _hf_logits(src, "eager", 400)
    assert ref["full"].abs().max() > 1.0
    assert (full - ref["full"]).abs().max() <= PARITY_TOL
    assert (with_split - ref["split"]).abs().max() <= PARITY_TOL


@pytest.mark.slow
def test_round_trip_through_pp2_checkpoint_is_bit_identical(tokenizer_dir, tmp_path):
    src = write_random_eurobert(tmp_path / "src", vocab_size=400, tokenizer_dir=tokenizer_dir, seed=6)
    from_hf(src, tmp_path / "ckpt", pp=2, progress=False)
    to_hf(tmp_path / "ckpt", tmp_path / "back", progress=False)
    before, after = hf_state(src), hf_state(tmp_path / "back")
    assert sorted(before) == sorted(after)
    assert all(torch.equal(after[k], v) and after[k].dtype == v.dtype for k, v in before.items())
