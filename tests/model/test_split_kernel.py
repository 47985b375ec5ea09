"""The split kernels that compute only the visible pairs equal megatron's `local` kernel.

`sdpa_split` (two mask-free SDPA calls per group of equal splits) runs on CPU: its forward and
q/k/v gradients must equal `local` (the unfused reference, dense mask) and `sdpa` on the
compiled-flex tests' split shapes (split 0, a full prefix, odd lengths, padding), plus a batch
whose splits repeat (groups of several, non-contiguous samples). The one-call `varlen` backend
needs CUDA (torch's varlen kernel); its orchestration (segment cuts, the prefix keys gathered
twice, output in natural order) runs here through the CPU varlen emulation, on the same shapes.
On CUDA the real kernels are compared in bf16 (`-m gpu`).
"""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.model.attention_masks import SplitGroups, VarlenSegments, sdpa_varlen_attention, varlen_split_attention
from megatron_biglm.model.attention_params import build_attention_params, resolve_backend, torch_varlen_available
from model_fixtures import core_attention_and_qkv, init_megatron, tiny_config

DEVICE = torch.device("cpu")
ATOL = RTOL = 2e-5
HEAD_DIM = 16
#: (name, heads, groups, s, splits, valid lengths or None)
CASES = [
    ("gqa_s77_padded", 4, 2, 77, [0, 61, 31], [77, 61, 70]),       # split 0, a full prefix of a padded row
    ("mha_s256_block_multiple", 2, 2, 256, [0, 256, 101], None),   # split 0, a full prefix, odd split
    ("repeated_splits", 4, 1, 33, [5, 0, 5, 33, 5], [30, 33, 30, 33, 33]),  # groups of several samples
]
CASE_IDS = [c[0] for c in CASES]


@pytest.fixture(scope="module", autouse=True)
def _megatron():
    from megatron.core import tensor_parallel

    init_megatron()
    tensor_parallel.model_parallel_cuda_manual_seed(0)  # megatron's `local` kernel forks this RNG


def _core_and_qkv(case, seed: int, device=DEVICE, dtype=torch.float32):
    _, heads, groups, s, splits, _ = case
    return core_attention_and_qkv(heads, groups, s, len(splits), seed, HEAD_DIM, device, dtype)


def _params(case, backend, device=DEVICE):
    _, _, _, s, splits, valid = case
    return build_attention_params(torch.tensor(splits), s, backend, device=device,
                                  valid_lengths=None if valid is None else torch.tensor(valid))


def _run(fn, qkv):
    """Output and the q/k/v gradients of a fixed random projection of it."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in qkv)
    out = fn(q, k, v)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.device, out.dtype)
    (out.float() * weight.float()).sum().backward()
    return out.detach().float(), [t.grad.float() for t in (q, k, v)]


def _assert_all_close(got, want, what, atol=ATOL, rtol=RTOL):
    (out, grads), (ref_out, ref_grads) = got, want
    torch.testing.assert_close(out, ref_out, atol=atol, rtol=rtol, msg=lambda m: f"{what} output: {m}")
    for label, g, w in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"{what} d{label}: {m}")


def _core_fn(core, params):
    return lambda q, k, v: core(q, k, v, None, packed_seq_params=params)


def _varlen_emulated_fn(core, params):
    """The varlen backend's orchestration with the CPU emulation of the varlen kernel."""
    def fn(q, k, v):
        out = varlen_split_attention(*(t.transpose(0, 1) for t in (q, k, v)), params.derived,
                                     sdpa_varlen_attention, softmax_scale=core.softmax_scale)
        return out.transpose(0, 1).reshape(q.shape[0], q.shape[1], -1)
    return fn


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_split_kernel_sdpa_split_matches_local_and_sdpa(case):
    name, s = case[0], case[3]
    core, qkv = _core_and_qkv(case, seed=s)
    params = _params(case, "sdpa_split")
    assert isinstance(params.derived, SplitGroups)  # no s x s mask on this path
    got = _run(_core_fn(core, params), qkv)
    for backend in ("local", "sdpa"):
        _assert_all_close(got, _run(_core_fn(core, _params(case, backend)), qkv), f"{name} sdpa_split vs {backend}")


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_split_kernel_varlen_segments_match_local(case):
    name, s = case[0], case[3]
    core, qkv = _core_and_qkv(case, seed=s + 1)
    params = _params(case, "varlen")
    assert isinstance(params.derived, VarlenSegments)
    got = _run(_varlen_emulated_fn(core, params), qkv)
    _assert_all_close(got, _run(_core_fn(core, _params(case, "local")), qkv), f"{name} varlen segments vs local")


def test_split_kernel_groups_share_calls_for_repeated_splits():
    """Equal (split, valid) pairs share a group: two SDPA calls per group, not per sample."""
    params = _params(CASES[2], "sdpa_split")
    groups = {(p, v): samples for samples, p, v in params.derived.groups}
    assert groups == {(5, 30): (0, 2), (0, 33): (1,), (33, 33): (3,), (5, 33): (4,)}


def test_split_kernel_varlen_is_refused_where_torch_cannot_run_it():
    """Explicit `varlen` needs CUDA and torch's varlen attention; `auto` never picks it without them."""
    if torch_varlen_available():
        pytest.skip("this machine runs torch's varlen attention")
    with pytest.raises(ImportError, match="torch.nn.attention.varlen"):
        resolve_backend("varlen", torch.bfloat16)
    assert resolve_backend("auto", torch.bfloat16) != "varlen"
    assert resolve_backend("sdpa_split", torch.float32) == "sdpa_split"
    with pytest.raises(ValueError, match="'varlen' has no attention dropout"):
        resolve_backend("varlen", torch.bfloat16, attention_dropout=0.1)


def test_split_kernel_sdpa_split_trains_a_model_like_sdpa():
    """The whole model: the loss and its gradients with sdpa_split equal those with sdpa."""
    from model_fixtures import build_model, mean_masked_loss, random_batch

    cfg = tiny_config()
    batch = random_batch(cfg, 3, 40, seed=5)
    batch["split"] = torch.tensor([0, 40, 17])
    results = {}
    for backend in ("sdpa", "sdpa_split"):
        model = build_model(tiny_config(attention_backend=backend), seed=3)
        loss = mean_masked_loss(model, batch)
        loss.backward()
        results[backend] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    (loss_a, grads_a), (loss_b, grads_b) = results["sdpa"], results["sdpa_split"]
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)
    assert len(grads_a) == len(grads_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, atol=2e-5, rtol=2e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["sdpa_split", "varlen"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_gpu_split_kernel_matches_local_in_bf16(case, backend):
    """The CUDA kernels themselves (flash/cuDNN SDPA; torch's varlen attention) against `local`
    on the same bf16 inputs, computed in fp32."""
    if backend == "varlen" and not torch_varlen_available():
        pytest.skip("this torch has no torch.nn.attention.varlen")
    name, s = case[0], case[3]
    cuda = torch.device("cuda")
    ref_core, qkv = _core_and_qkv(case, seed=s, device=cuda, dtype=torch.bfloat16)
    core = _core_and_qkv(case, seed=s, device=cuda)[0].to(torch.bfloat16)
    got = _run(_core_fn(core, _params(case, backend, cuda)), qkv)
    want = _run(_core_fn(ref_core, _params(case, "local", cuda)), [t.float() for t in qkv])
    _assert_all_close(got, want, f"{name} {backend} (bf16) vs local (fp32)", atol=3e-2, rtol=3e-2)
