"""Compiled FlexAttention (`model.attention_compile`) against the sdpa and megatron `local` kernels.

The compiled flex kernel (inductor's fused kernel: no s x s scores) must compute the split
rule exactly as the dense-mask kernels do. Cases cover one batch row per kind of split: split 0
(every row a suffix row: full attention), a full prefix (split = the valid length), odd splits,
sequence lengths that are not a multiple of the 128 block and odd ones, right padding
(`valid_lengths`: keys past it masked, padded query rows see the real keys of their row, as in
the dense reference), and GQA (fewer key/value groups than heads).

Tolerance: fp32 on both sides, |compiled - reference| <= 2e-5 abs + 2e-5 rel (measured max
about 1e-6: the kernels differ only in summation order and online softmax).

Backward: torch 2.13 has no FlexAttention backward on CPU, compiled or eager (it raises
NotImplementedError naming CPU); those tests skip with torch's message and run on CUDA.
Each distinct shape compiles once (`dynamic=False`), so there are few shapes.
"""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.model.attention_backends.flex import FlexMask
from megatron_biglm.model.attention_masks import flex_split_block_mask
from megatron_biglm.model.attention_params import BiGLMAttentionParams, build_attention_params
from model_fixtures import build_model, core_attention_and_qkv, init_megatron, mean_masked_loss, random_batch, tiny_config

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ATOL = RTOL = 2e-5

#: (name, heads, groups, s, splits, valid lengths or None). Each shape compiles once (about
#: 30 s of C++ compilation on a 2-core CPU), so two shapes carry every kind of split; the
#: whole-model tests below reuse the first one's compiled kernel (same b, heads, s).
CASES = [
    # s = 77: odd and not a multiple of the 128 block; GQA; padding; split 0, a full prefix
    # of a padded row (split = valid length), an odd split inside a padded row
    ("gqa_s77_padded", 4, 2, 77, [0, 61, 31], [77, 61, 70]),
    # s = 256, a multiple of the block; multi-head; split 0, a full prefix (split = s), odd split
    ("mha_s256_block_multiple", 2, 2, 256, [0, 256, 101], None),
]
CASE_IDS = [c[0] for c in CASES]
HEAD_DIM = 16


@pytest.fixture(scope="module", autouse=True)
def _megatron():
    from megatron.core import tensor_parallel

    init_megatron()
    tensor_parallel.model_parallel_cuda_manual_seed(0)  # megatron's `local` kernel forks this RNG


def _core_and_qkv(case, seed: int):
    _, heads, groups, s, splits, _ = case
    return core_attention_and_qkv(heads, groups, s, len(splits), seed, HEAD_DIM, DEVICE)


def _run(core, qkv, params, grad: bool):
    """Output [s, b, h*d] and, with `grad`, the q/k/v gradients of a fixed random projection."""
    q, k, v = (t.detach().clone().requires_grad_(grad) for t in qkv)
    out = core(q, k, v, None, packed_seq_params=params)
    if not grad:
        return out.detach(), None
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device)
    (out * weight).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]


def _params(case, backend: str, compiled: bool = True):
    _, _, _, s, splits, valid = case
    split = torch.tensor(splits)
    valid = None if valid is None else torch.tensor(valid)
    return build_attention_params(split, s, backend, valid_lengths=valid, device=DEVICE, compile_flex=compiled)


def _cpu_backward_missing(exc: NotImplementedError) -> bool:
    return DEVICE.type == "cpu" and "backward on CPU" in str(exc)


def _assert_close(got, want, what: str):
    err = (got - want).abs().max().item()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL, msg=f"{what}: max |diff| {err:.2e}")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_compiled_flex_forward_matches_sdpa_and_local(case):
    name, s = case[0], case[3]
    core, qkv = _core_and_qkv(case, seed=s)
    flex_params = _params(case, "flex")
    assert flex_params.derived.compiled and flex_params.derived.block_mask is not None
    with torch.no_grad():
        got, _ = _run(core, qkv, flex_params, grad=False)
        for backend in ("sdpa", "local"):
            want, _ = _run(core, qkv, _params(case, backend), grad=False)
            _assert_close(got, want, f"{name} flex vs {backend}")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_compiled_flex_backward_matches_sdpa_and_local(case):
    name, s = case[0], case[3]
    core, qkv = _core_and_qkv(case, seed=s + 1)
    try:
        got, got_grads = _run(core, qkv, _params(case, "flex"), grad=True)
    except NotImplementedError as exc:
        if _cpu_backward_missing(exc):
            pytest.skip(str(exc))
        raise
    for backend in ("sdpa", "local"):
        want, want_grads = _run(core, qkv, _params(case, backend), grad=True)
        _assert_close(got, want, f"{name} flex vs {backend} output")
        for label, g, w in zip("qkv", got_grads, want_grads):
            _assert_close(g, w, f"{name} flex vs {backend} d{label}")


def test_compiled_flex_with_all_zero_split_is_full_attention():
    """An all-0 split needs no mask (the model then runs the full-attention kernel); a
    BlockMask built for it anyway must give full attention too."""
    heads, groups, s, b = 2, 2, 256, 3  # the second case's shape: no new compile
    assert build_attention_params(torch.zeros(b, dtype=torch.long), s, "flex", compile_flex=True).is_full_attention
    core, qkv = core_attention_and_qkv(heads, groups, s, b, 3, HEAD_DIM, DEVICE)
    block_mask = flex_split_block_mask(torch.zeros(b, dtype=torch.long), s, device=DEVICE)
    with torch.no_grad():
        got, _ = _run(core, qkv, BiGLMAttentionParams(backend="flex", derived=FlexMask(block_mask, compiled=True)),
                      grad=False)
        want, _ = _run(core, qkv, BiGLMAttentionParams(backend="sdpa"), grad=False)
    _assert_close(got, want, "all-0 split flex vs full sdpa")


# ---------------------------------------------------------------- the whole model
SEQ = 77  # the first case's shape (TINY_TEST_SHAPE has 4 heads, 2 groups, head dim 16)


@pytest.fixture(scope="module")
def models():
    """Two tiny GQA models with the same weights: compiled flex, and the eager sdpa reference."""
    flex = build_model(tiny_config(attention_backend="flex", attention_compile=True), seed=5).to(DEVICE)
    ref = build_model(tiny_config(attention_backend="sdpa"), seed=5).to(DEVICE)
    ref.load_state_dict(flex.state_dict())
    return flex, ref


def _batch(cfg):
    batch = random_batch(cfg, 3, SEQ, seed=41)
    batch["split"] = torch.tensor([0, SEQ, 37])  # full attention, full prefix, odd split
    assert cfg.head_dim == HEAD_DIM and cfg.num_attention_heads == CASES[0][1]
    return {k: v.to(DEVICE) for k, v in batch.items()}


def test_compile_flex_model_config_reaches_the_kernel(models):
    """`model.attention_compile` is read from YAML/CLI values, checked, and reaches the params."""
    from megatron_biglm.model.attention_params import resolve_compile
    from megatron_biglm.model.config import ModelConfigError
    from megatron_biglm.model.presets import load_preset

    for written, value in (("true", True), ("off", False), (False, False), ("auto", "auto")):
        assert load_preset("tiny", {"attention_compile": written}).attention_compile == value
    assert load_preset("tiny").attention_compile == "auto"
    with pytest.raises(ModelConfigError, match="attention_compile"):
        load_preset("tiny", {"attention_compile": "sometimes"})

    flex, _ = models
    assert flex.attention_backend == "flex" and flex.attention_compile is True
    assert resolve_compile("auto", "cpu") is False and resolve_compile("auto", "cuda") is True
    assert resolve_compile(False, "cuda") is False and resolve_compile(True, "cpu") is True
    with pytest.raises(ValueError, match="attention_compile"):
        resolve_compile("yes please", "cpu")


def test_compile_flex_model_loss_matches_eager_sdpa(models):
    flex, ref = models
    batch = _batch(flex.model_config)
    with torch.no_grad():
        got = mean_masked_loss(flex, batch)
        want = mean_masked_loss(ref, batch)
        h_got = flex(batch["input_ids"], split=batch["split"], return_hidden=True)
        h_want = ref(batch["input_ids"], split=batch["split"], return_hidden=True)
    assert abs(got.item() - want.item()) < 1e-5
    _assert_close(h_got, h_want, "tiny model hidden states, compiled flex vs sdpa")


def test_compile_flex_model_training_step_matches_eager_sdpa(models):
    """One AdamW step: the loss, every gradient and every updated weight agree."""
    flex, ref = models
    batch = _batch(flex.model_config)
    results = []
    for model in (flex, ref):
        params = dict(model.named_parameters())
        snapshot = {n: p.detach().clone() for n, p in params.items()}
        model.zero_grad(set_to_none=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        try:
            loss = mean_masked_loss(model, batch)
            loss.backward()
        except NotImplementedError as exc:
            if _cpu_backward_missing(exc):
                pytest.skip(str(exc))
            raise
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        results.append((loss.item(), grads, {n: p.detach().clone() for n, p in model.named_parameters()}))
        with torch.no_grad():  # leave the shared fixture's weights as they were
            for n, p in params.items():
                p.copy_(snapshot[n])
    (loss, grads, weights), (ref_loss, ref_grads, ref_weights) = results
    assert abs(loss - ref_loss) < 1e-5
    for name in ref_grads:
        _assert_close(grads[name], ref_grads[name], f"grad {name}")
        _assert_close(weights[name], ref_weights[name], f"updated {name}")


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the CPU-only refusal of FlexAttention's backward")
def test_compile_flex_training_on_cpu_is_refused_naming_the_fix(models):
    flex, _ = models
    with pytest.raises(NotImplementedError, match="attention_backend to sdpa or auto"):
        mean_masked_loss(flex, _batch(flex.model_config))
