"""bf16 mixed precision on CPU (`training.precision=bf16` + `training.allow_cpu_bf16=true`),
in three layouts: one process, DP=2 with the distributed optimizer, TP=2 (torchrun, gloo).

For each layout, from real runs on the Shakespeare training data:
- the megatron objects hold what mixed precision means: bf16 model parameters, fp32 DDP
  gradient buffers (and bf16 parameter buffers for the distributed optimizer), a megatron
  mixed-precision optimizer whose main parameters and main gradients are fp32 (read from
  the live optimizer, not from the config);
- the loss follows the fp32 run's over STEPS steps within a stated tolerance;
- a run stopped at STEPS/2 and resumed repeats the uninterrupted run's losses and gradient
  norms bit for bit;
- the bf16 checkpoint exports to HF, and the HF model's logits equal megatron's up to bf16
  rounding.

bf16 matmuls are about 15x slower than fp32 ones on an AVX2 CPU, so the model is the tiny
2-layer, 64-wide one and each layout's runs are shared by its tests (module fixtures).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from train_fixtures import TrainData, loss_and_grad_norm, tiny_overrides, train_data  # noqa: F401 (fixture)

STEPS = 50
HALF = STEPS // 2
BF16 = {"training.precision": "bf16", "training.allow_cpu_bf16": True}
LAYOUTS = {
    "single": {},
    "dp2": {"optimizer.use_distributed_optimizer": True},
    "tp2": {"parallelism.tensor_model_parallel_size": 2},
}
# Largest |bf16 loss - fp32 loss| over the 50 steps, measured the same on megatron-core 0.16.1
# (Python 3.11) and 0.19.2 (Python 3.12): single 0.00418, dp2 0.00568, tp2 0.00479. The
# tolerances leave about 3x room.
LOSS_TOL = {"single": 0.0125, "dp2": 0.017, "tp2": 0.0145}
# bf16 logits of two implementations (megatron's and HF's) differ by bf16 rounding of the
# activations: a few units in the last place of the largest logit.
LOGIT_TOL = 3e-2


def _optimizers(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _dtypes(model_chunks, optimizer) -> dict:
    """What the live megatron objects hold, as dtype names."""
    names = lambda ts: sorted({str(t.dtype).replace("torch.", "") for t in ts})  # noqa: E731
    params = [p for chunk in model_chunks for p in chunk.module.parameters()]
    optimizers = _optimizers(optimizer)
    main_params = [p for o in optimizers for g in o.optimizer.param_groups for p in g["params"]]
    return {
        "model_params": names(params),
        "ddp_main_grads": names(p.main_grad for p in params),
        "ddp_grad_buffers": names(b.grad_data for chunk in model_chunks for b in chunk.buffers),
        # the distributed optimizer's parameter buffers (the all-gather's), None without it
        "ddp_param_buffers": names(b.param_data for chunk in model_chunks for b in chunk.buffers
                                   if b.param_data is not None),
        "optimizers": sorted({type(o).__name__ for o in optimizers}),
        "main_params": names(main_params),
        "main_grads": names(p.grad for p in main_params if p.grad is not None),
        "main_params_with_grad": sum(p.grad is not None for p in main_params),
    }


def run_layout(tokenizer: str, prefix: str, root: str, layout: str) -> dict:
    """A bf16 run of STEPS steps, the same run stopped at HALF and resumed, and the dtypes of
    the first run's model and optimizer. In-process for `single`, per rank under torchrun."""
    from megatron_biglm.cli.train import train
    from megatron_biglm.training import build

    data, root = TrainData(tokenizer, prefix), Path(root)
    extra = {**BF16, **LAYOUTS[layout]}
    built = []
    original = build.build_optimizer

    def keep(section, model_chunks, precision):
        optimizer = original(section, model_chunks, precision)
        built.append((model_chunks, optimizer))
        return optimizer

    build.build_optimizer = keep
    try:
        straight = train(None, tiny_overrides(data, root / "straight", steps=STEPS, **extra))
        dtypes = _dtypes(*built[0])
        built.clear()
        train(None, tiny_overrides(data, root / "split", steps=STEPS, **extra,
                                   **{"training.exit_after_steps": HALF}))
        train(None, tiny_overrides(data, root / "split", steps=STEPS, **extra))
    finally:
        build.build_optimizer = original
    return {"dtypes": dtypes, "checkpoint": straight.checkpoint,
            "straight": sorted([s, *v] for s, v in loss_and_grad_norm(root / "straight").items()),
            "split": sorted([s, *v] for s, v in loss_and_grad_norm(root / "split").items())}


@pytest.fixture(scope="module")
def fp32_losses(train_data, tmp_path_factory):  # noqa: F811
    """The fp32 reference: one process (DP=2 and TP=2 repeat it to 1e-5 in fp32)."""
    from megatron_biglm.cli.train import train

    run = tmp_path_factory.mktemp("fp32") / "run"
    train(None, tiny_overrides(train_data, run, steps=STEPS))
    return [loss for _, (loss, _) in sorted(loss_and_grad_norm(run).items())]


@pytest.fixture(scope="module", params=[
    pytest.param("single", marks=pytest.mark.slow),  # bf16 matmuls are ~16x fp32's on CPU
    pytest.param("dp2", marks=pytest.mark.slow),
    pytest.param("tp2", marks=pytest.mark.slow),
])
def bf16_run(request, train_data, tmp_path_factory):  # noqa: F811
    layout = request.param
    root = tmp_path_factory.mktemp(f"bf16_{layout}")
    if layout == "single":
        result = run_layout(train_data.tokenizer, train_data.prefix, str(root), layout)
    else:
        from torchrun_util import run_function

        res = run_function("tests/training/test_bf16_cpu.py:run_layout", nproc=2, timeout=1200, kwargs={
            "tokenizer": train_data.tokenizer, "prefix": train_data.prefix, "root": str(root), "layout": layout})
        result = res.check().results[0]
    return layout, result


def test_bf16_dtypes_are_mixed_precision(bf16_run):
    layout, run = bf16_run
    d = run["dtypes"]
    assert d["model_params"] == ["bfloat16"]
    assert d["ddp_main_grads"] == ["float32"] and d["ddp_grad_buffers"] == ["float32"]
    assert d["ddp_param_buffers"] == (["bfloat16"] if layout == "dp2" else [])
    expected = "DistributedOptimizer" if layout == "dp2" else "Float16OptimizerWithFloat16Params"
    assert d["optimizers"] == [expected]
    assert d["main_params"] == ["float32"]
    assert d["main_grads"] == ["float32"] and d["main_params_with_grad"] > 0


def test_bf16_loss_follows_fp32(bf16_run, fp32_losses):
    layout, run = bf16_run
    losses = [loss for _, loss, _ in run["straight"]]
    assert len(losses) == STEPS == len(fp32_losses)
    gap = max(abs(a - b) for a, b in zip(losses, fp32_losses))
    print(f"bf16 {layout}: max |bf16 - fp32| loss gap over {STEPS} steps {gap:.5f}")
    assert gap <= LOSS_TOL[layout], f"{layout}: max |bf16 - fp32| loss gap {gap:.5f}"
    assert losses[-1] < losses[0] - 1.0  # it learns


def test_bf16_resumes_bit_exactly(bf16_run):
    _, run = bf16_run
    assert len(run["split"]) == STEPS
    assert run["split"] == run["straight"]  # losses and grad norms, every step, exactly


def test_bf16_checkpoint_exports_to_hf(bf16_run, tmp_path):
    from transformers import AutoModelForMaskedLM

    from convert_fixtures import fixed_batch
    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.inference.loading import load_megatron_checkpoint

    _, run = bf16_run
    summary = to_hf(run["checkpoint"], tmp_path / "hf", progress=False)
    loaded = load_megatron_checkpoint(run["checkpoint"], dtype="auto")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    vocab = loaded.checkpoint.model_config.vocab_size
    ids, _ = fixed_batch(vocab)
    hf = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), attn_implementation="eager").eval()
    assert {p.dtype for p in hf.parameters()} == {torch.bfloat16}, summary
    with torch.no_grad():
        ours = loaded.model(ids, split=None)[..., :vocab].float()
        theirs = hf(input_ids=ids).logits[..., :vocab].float()
    scale = 1.0 + ours.abs().max().item()
    assert (ours - theirs).abs().max().item() <= LOGIT_TOL * scale
    assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() > 0.95


def test_bf16_on_cpu_needs_the_opt_in():
    from megatron_biglm.config import ConfigError, load_config
    from megatron_biglm.training.build import resolve_precision

    with pytest.raises(ConfigError, match="training.allow_cpu_bf16=true"):
        resolve_precision(load_config(None, ["training.precision=bf16"]).training)
    opted_in = load_config(None, ["training.precision=bf16", "training.allow_cpu_bf16=true"])
    assert resolve_precision(opted_in.training) == "bf16"
    if not torch.cuda.is_available():
        assert resolve_precision(load_config(None, []).training) == "fp32"  # auto on CPU
    with pytest.raises(ConfigError, match="only applies to training.precision=bf16"):
        load_config(None, ["training.allow_cpu_bf16=true"])
    with pytest.raises(ConfigError, match="for the megatron backend"):
        load_config(None, ["training.precision=bf16", "training.allow_cpu_bf16=true", "training.backend=deepspeed"])
