"""The one-pass RoPE equals megatron-core's unfused RoPE on the case BiGLM runs (outputs and input
gradients, fp32 and bf16, GQA shapes, q and k as views of a fused QKV, mscale, per-sample
positions), hands every other case to megatron's function untouched, and leaves a BiGLM model's
loss and gradients as they were."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron.core import parallel_state
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer import attention as mcore_attention

from megatron_biglm import patches
from megatron_biglm.patches import rope_one_pass

DISPATCH = rope_one_pass.make_dispatcher(rope_utils.apply_rotary_pos_emb)
ONE_PASS_BACKWARD = "OnePassRopeBackward"


@pytest.fixture(scope="module", autouse=True)
def megatron_groups():
    from model_fixtures import init_megatron

    init_megatron()


def _config(**changes) -> TransformerConfig:
    """A real megatron config with RoPE switches set on it after construction (constructing an
    MLA or fused-RoPE config would ask for settings this path never reads)."""
    cfg = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, use_cpu_initialization=True)
    for key, value in changes.items():
        setattr(cfg, key, value)
    return cfg


def _freqs(s: int, d: int, base: float, percent: float = 1.0, interleaved: bool = False) -> torch.Tensor:
    """megatron's own RoPE angles, [s, 1, 1, d * percent]."""
    return RotaryEmbedding(kv_channels=d, rotary_percent=percent, rotary_interleaved=interleaved,
                           rotary_base=base, use_cpu_initialization=True)(s)


def _fused_qkv(s, b, groups, per_group, d, dtype, g):
    """A fused QKV projection output and the views megatron splits off it: q
    [s, b, groups*per_group, d] and k [s, b, groups, d], neither contiguous."""
    qkv = torch.randn(s, b, groups, (per_group + 2) * d, generator=g).to(dtype)

    def q(x):
        return x[..., : per_group * d].unflatten(-1, (per_group, d)).flatten(2, 3)

    def k(x):
        return x[..., per_group * d: (per_group + 1) * d]

    return qkv, (q, k)


def _run(fn, base, view, *args, grad, **kwargs):
    """fn(view(base)) and the gradient that reaches view(base) from `grad`."""
    leaf = base.detach().clone().requires_grad_()
    out = fn(view(leaf), *args, **kwargs)
    out.backward(grad)
    return out, view(leaf.grad)


def _whole(x):
    return x


def _rounding_bound(t, cos, sin, dtype) -> torch.Tensor:
    """What rounding can move one element of t*cos + rotate_half(t)*sin: both sides round each
    product and the sum (megatron three times, the one-pass at most as often), each rounding
    by at most u*|value| (u = eps/2), and |sum| <= |t*cos| + |rotate_half(t)*sin|."""
    t, cos, sin = t.double(), cos.double(), sin.double()
    rotated = torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), dim=-1)
    return 4 * (torch.finfo(dtype).eps / 2) * ((t * cos).abs() + (rotated * sin).abs())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=st.integers(1, 48), b=st.integers(1, 3), groups=st.integers(1, 3), per_group=st.integers(1, 4),
       d=st.sampled_from([2, 8, 16, 64]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       mscale=st.sampled_from([1.0, 0.7, 1.37]), base=st.sampled_from([10000.0, 500.0]),
       per_sample=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_the_plain_case_matches_megatrons_rope(s, b, groups, per_group, d, dtype, mscale, base, per_sample, seed):
    g = torch.Generator().manual_seed(seed)
    freqs = _freqs(s, d, base)
    if per_sample:  # each sample at its own positions, [s, b, 1, d] as with a KV cache
        freqs = freqs[torch.randint(0, s, (s, b), generator=g)].squeeze(2)
    cfg = _config()
    qkv, views = _fused_qkv(s, b, groups, per_group, d, dtype, g)
    for view in views:
        t = view(qkv)
        grad = torch.randn(t.shape, generator=g).to(dtype)
        ours, ours_grad = _run(DISPATCH, qkv, view, freqs, cfg, mscale=mscale, grad=grad)
        theirs, theirs_grad = _run(rope_utils._apply_rotary_pos_emb_bshd, qkv, view, freqs, mscale=mscale,
                                   grad=grad)
        assert type(ours.grad_fn).__name__ == ONE_PASS_BACKWARD  # the one-pass path ran
        assert ours.dtype == theirs.dtype == dtype and ours.shape == t.shape and ours.is_contiguous()
        cos = (torch.cos(freqs) * mscale).to(dtype)
        sin = (torch.sin(freqs) * mscale).to(dtype)
        assert ((ours.double() - theirs.double()).abs() <= _rounding_bound(t, cos, sin, dtype)).all()
        # dL/dt = g*cos + swap_halves(g*signed sin): the same bound with g for t and a sin swap
        swapped = torch.cat((sin[..., d // 2:], sin[..., : d // 2]), dim=-1)
        bound = _rounding_bound(grad, cos, swapped, dtype)
        assert ((ours_grad.double() - theirs_grad.double()).abs() <= bound).all()


def test_fp32_is_within_a_few_ulps_at_biglms_shape():
    g = torch.Generator().manual_seed(3)
    qkv, (q, _) = _fused_qkv(128, 4, 3, 3, 64, torch.float32, g)
    freqs, grad = _freqs(128, 64, 10000.0), torch.randn(q(qkv).shape, generator=g)
    ours, ours_grad = _run(DISPATCH, qkv, q, freqs, _config(), grad=grad)
    theirs, theirs_grad = _run(rope_utils._apply_rotary_pos_emb_bshd, qkv, q, freqs, grad=grad)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours_grad, theirs_grad, rtol=1e-6, atol=1e-6)


def test_second_order_gradients_are_exact():
    g = torch.Generator().manual_seed(5)
    t = torch.randn(6, 2, 3, 8, generator=g, dtype=torch.float64, requires_grad=True)
    freqs = _freqs(6, 8, 10000.0).double()
    fn = lambda x: rope_one_pass.one_pass_rope(x, freqs, 1.3)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (t,)) and torch.autograd.gradgradcheck(fn, (t,))


def _other_cases():
    """(config changes, t, freqs, keyword arguments) for each case the one pass must not take."""
    g = torch.Generator().manual_seed(11)
    t = torch.randn(10, 2, 4, 16, generator=g)
    cases = {
        "partial rotary (t_pass non-empty)": ({}, t, _freqs(10, 16, 10000.0, percent=0.5), {}),
        "interleaved rotation": ({"rotary_interleaved": True}, t, _freqs(10, 16, 10000.0, interleaved=True), {}),
        "multi-latent attention": ({"multi_latent_attention": True}, t, _freqs(10, 16, 10000.0), {}),
        "packed sequences (thd)": ({}, t.flatten(0, 1), _freqs(20, 16, 10000.0),
                                   {"cu_seqlens": torch.tensor([0, 7, 20], dtype=torch.int32)}),
        "freqs that need a gradient": ({}, t, _freqs(10, 16, 10000.0).requires_grad_(), {}),
    }
    if HAS_MLA_ARGUMENT:
        cases["MLA-style interleave argument"] = ({}, t, _freqs(10, 16, 10000.0), {"mla_rotary_interleaved": True})
    return cases


HAS_MLA_ARGUMENT = "mla_rotary_interleaved" in rope_utils.apply_rotary_pos_emb.__code__.co_varnames
OTHER_CASES = ("partial rotary (t_pass non-empty)", "interleaved rotation", "multi-latent attention",
               "packed sequences (thd)", "freqs that need a gradient") + (
    ("MLA-style interleave argument",) if HAS_MLA_ARGUMENT else ())


@pytest.mark.parametrize("case", OTHER_CASES)
def test_every_other_case_is_megatrons_function_bit_for_bit(case):
    changes, t, freqs, kwargs = _other_cases()[case]
    cfg, cp = _config(**changes), parallel_state.get_context_parallel_group()
    grad = torch.randn(t.shape, generator=torch.Generator().manual_seed(2))
    ours, ours_grad = _run(DISPATCH, t, _whole, freqs, cfg, mscale=1.2, cp_group=cp, grad=grad, **kwargs)
    theirs, theirs_grad = _run(rope_utils.apply_rotary_pos_emb, t, _whole, freqs, cfg, mscale=1.2, cp_group=cp,
                               grad=grad, **kwargs)
    assert type(ours.grad_fn).__name__ != ONE_PASS_BACKWARD
    assert torch.equal(ours, theirs) and torch.equal(ours_grad, theirs_grad)


def test_apply_replaces_attentions_rope_once():
    assert patches.apply_rope_one_pass() is True and patches.apply_rope_one_pass() is True
    installed = mcore_attention.apply_rotary_pos_emb
    assert installed.__wrapped__ is rope_utils.apply_rotary_pos_emb  # not wrapped twice
    t, freqs = torch.randn(4, 1, 2, 8), _freqs(4, 8, 10000.0)
    assert type(installed(t.requires_grad_(), freqs, _config()).grad_fn).__name__ == ONE_PASS_BACKWARD


def _count_nodes(root, name: str) -> int:
    """How many nodes called `name` the autograd graph under `root` holds."""
    seen, stack, count = set(), [root], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += type(node).__name__ == name
        stack.extend(child for child, _ in node.next_functions)
    return count


def test_a_biglm_model_has_the_same_loss_and_gradients(monkeypatch):
    from model_fixtures import build_model, grads_by_name, mean_masked_loss, random_batch, tiny_config

    cfg = tiny_config()
    model = build_model(cfg, seed=4)  # building the layer spec applies the patch
    assert mcore_attention.apply_rotary_pos_emb.__wrapped__ is rope_utils.apply_rotary_pos_emb
    batch = random_batch(cfg, batch=3, seq=40, seed=9)

    def loss_and_grads():
        model.zero_grad(set_to_none=True)
        loss = mean_masked_loss(model, batch)
        one_pass_nodes = _count_nodes(loss.grad_fn, ONE_PASS_BACKWARD)
        loss.backward()
        return loss.detach(), grads_by_name(model), one_pass_nodes

    ours, ours_grads, nodes = loss_and_grads()
    assert nodes == 2 * cfg.num_layers  # q and k of every layer went through the one pass
    monkeypatch.setattr(mcore_attention, "apply_rotary_pos_emb", rope_utils.apply_rotary_pos_emb)
    theirs, theirs_grads, nodes = loss_and_grads()
    assert nodes == 0
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    assert ours_grads.keys() == theirs_grads.keys() and ours_grads
    for name in ours_grads:
        torch.testing.assert_close(ours_grads[name], theirs_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def _fresh(t, freqs, mscale=1.0):
    """The one pass with tables built for this call only."""
    return rope_one_pass.OnePassRope.apply(t, *rope_one_pass._tables(freqs, mscale, t.dtype))


def test_the_tables_are_built_once_per_angle_tensor_and_change_nothing(monkeypatch):
    built = []
    tables = rope_one_pass._tables
    monkeypatch.setattr(rope_one_pass, "_tables", lambda *a: built.append(a) or tables(*a))
    monkeypatch.setattr(rope_one_pass, "_LAST", rope_one_pass._LastTables())
    g = torch.Generator().manual_seed(21)
    freqs = _freqs(12, 16, 10000.0)
    q, k = torch.randn(12, 2, 4, 16, generator=g), torch.randn(12, 2, 2, 16, generator=g)
    outs = [rope_one_pass.one_pass_rope(t, freqs, 1.1) for t in (q, k, q, k)]  # q and k of two layers
    assert len(built) == 1
    monkeypatch.setattr(rope_one_pass, "_tables", tables)
    for out, t in zip(outs, (q, k, q, k)):
        assert torch.equal(out, _fresh(t, freqs, 1.1))


def test_new_angles_a_changed_tensor_another_dtype_or_mscale_get_new_tables(monkeypatch):
    monkeypatch.setattr(rope_one_pass, "_LAST", rope_one_pass._LastTables())
    g = torch.Generator().manual_seed(22)
    t, freqs = torch.randn(10, 1, 2, 8, generator=g), _freqs(10, 8, 10000.0)
    rope_one_pass.one_pass_rope(t, freqs)
    freqs.mul_(0.5)  # in place: the same object at a new version
    assert torch.equal(rope_one_pass.one_pass_rope(t, freqs), _fresh(t, freqs))
    assert torch.equal(rope_one_pass.one_pass_rope(t, freqs, 0.7), _fresh(t, freqs, 0.7))
    half = t.bfloat16()
    out = rope_one_pass.one_pass_rope(half, freqs)
    assert out.dtype == torch.bfloat16 and torch.equal(out, _fresh(half, freqs))
    other = _freqs(10, 8, 500.0)
    assert torch.equal(rope_one_pass.one_pass_rope(t, other), _fresh(t, other))


def test_tables_seen_under_inference_mode_do_not_reach_a_training_backward(monkeypatch):
    monkeypatch.setattr(rope_one_pass, "_LAST", rope_one_pass._LastTables())
    g = torch.Generator().manual_seed(23)
    t, freqs = torch.randn(6, 1, 2, 8, generator=g), _freqs(6, 8, 10000.0)
    with torch.inference_mode():
        rope_one_pass.one_pass_rope(t, freqs)
    leaf = t.clone().requires_grad_()
    rope_one_pass.one_pass_rope(leaf, freqs).sum().backward()  # an inference table would raise here
    expected = t.clone().requires_grad_()
    _fresh(expected, freqs).sum().backward()
    assert torch.equal(leaf.grad, expected.grad)
