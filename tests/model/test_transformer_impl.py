"""`model.transformer_impl` and the optional fused-kernel packages, held to our own layers.

On every machine: `auto` resolves to local (Transformer Engine's layout is taken only by name
until its GPU parity test has passed), a config naming `transformer_engine` where it cannot run is refused with the package to
install, and the kernel report names the layers. Where a GPU and the package are present
(`-m gpu`), a model built with Transformer Engine's fused norm + linear modules, holding the
local model's weights, gives its logits and gradients within bf16 rounding; liger-kernel's
RMSNorm, SwiGLU and RoPE give ours. Each GPU test skips with the reason where its package is
absent.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
from model_fixtures import build_model, init_megatron, tiny_config

from megatron_biglm.config import ConfigError
from megatron_biglm.model.config import ModelConfigError
from megatron_biglm.model.kernels import kernel_report
from megatron_biglm.model.layer_spec import resolve_transformer_impl, transformer_engine_available

HAS_TE = importlib.util.find_spec("transformer_engine") is not None
HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_transformer_impl_auto_is_local_until_te_parity_has_run():
    assert resolve_transformer_impl("auto") == "local"
    assert resolve_transformer_impl("local") == "local"
    assert "kernels: layers local;" in str(kernel_report("sdpa", torch.float32))
    with pytest.raises(ModelConfigError, match="transformer_impl 'te' is not one of"):
        tiny_config(transformer_impl="te")


@pytest.mark.skipif(transformer_engine_available(), reason="Transformer Engine runs here")
def test_transformer_impl_refuses_transformer_engine_where_it_cannot_run():
    with pytest.raises(ConfigError, match=r"transformer_impl=transformer_engine needs Transformer Engine.*"
                                          r"pip install .*transformer-engine"):
        kernel_report("sdpa", torch.float32, transformer_impl="transformer_engine")
    init_megatron(1, 1)
    with pytest.raises(ValueError, match="set model.transformer_impl to auto or local"):
        build_model(tiny_config(transformer_impl="transformer_engine"))


# ------------------------------------------------------------------ GPU parity
#: local parameter name -> Transformer Engine's (the norms fused into the following linear)
TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight"}


def _te_name(name: str) -> str:
    for local, te in TE_NAMES.items():
        if name.endswith(local):
            return name[: -len(local)] + te
    return name


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not HAS_TE, reason="transformer_engine is not installed (pip install 'transformer-engine[pytorch]')")
def test_gpu_transformer_engine_layers_equal_local_ones_in_bf16():
    init_megatron(1, 1)
    local = build_model(tiny_config(vocab_size=200, transformer_impl="local"), seed=1).cuda().bfloat16()
    te = build_model(tiny_config(vocab_size=200, transformer_impl="transformer_engine"), seed=2).cuda().bfloat16()
    weights = {_te_name(k): v for k, v in local.state_dict().items() if not k.endswith("_extra_state")}
    missing, unexpected = te.load_state_dict(weights, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 200, (2, 64), generator=g).cuda()
    split = torch.tensor([20, 40]).cuda()
    outs, grads = [], []
    for model in (local, te):
        model.zero_grad(set_to_none=True)
        logits = model(ids, split=split)
        logits.float().square().mean().backward()
        outs.append(logits.float())
        grads.append({_te_name(k): p.grad.float() for k, p in model.named_parameters() if p.grad is not None})
    scale = outs[0].abs().max()
    assert (outs[0] - outs[1]).abs().max() <= 2e-2 * scale
    for name, grad in grads[0].items():
        other = grads[1][_te_name(name)]
        assert (grad - other).abs().max() <= 5e-2 * grad.abs().max().clamp_min(1e-6), name


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed (pip install liger-kernel)")
def test_gpu_liger_rmsnorm_swiglu_and_rope_equal_ours_in_bf16():
    from liger_kernel.ops.rope import LigerRopeFunction
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from megatron.core.models.common.embeddings.rope_utils import apply_rotary_pos_emb

    from megatron_biglm.model.rms_norm import BiGLMRMSNorm

    init_megatron(1, 1)
    cfg = tiny_config().to_transformer_config()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, cfg.hidden_size, generator=g).cuda().bfloat16()
    ours = BiGLMRMSNorm(cfg, cfg.hidden_size, eps=cfg.layernorm_epsilon).cuda().bfloat16()
    liger = LigerRMSNorm(cfg.hidden_size, eps=cfg.layernorm_epsilon, offset=0.0, casting_mode="llama").cuda().bfloat16()
    torch.testing.assert_close(liger(x).float(), ours(x).float(), atol=2e-2, rtol=2e-2)

    gate, up = (torch.randn(64, 96, generator=g).cuda().bfloat16() for _ in range(2))
    torch.testing.assert_close(LigerSiLUMulFunction.apply(gate, up).float(),
                               (torch.nn.functional.silu(gate.float()) * up.float()), atol=2e-2, rtol=2e-2)

    s, b, heads, d = 32, 2, 4, 16
    q = torch.randn(b, heads, s, d, generator=g).cuda()
    k = torch.randn(b, heads, s, d, generator=g).cuda()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(s).float(), inv)              # [s, d/2]
    emb = torch.cat([freqs, freqs], dim=-1).cuda()                 # [s, d]
    want_q = apply_rotary_pos_emb(q.permute(2, 0, 1, 3), emb[:, None, None, :], config=cfg)
    got_q, _ = LigerRopeFunction.apply(q, k, emb.cos()[None], emb.sin()[None])
    torch.testing.assert_close(got_q, want_q.permute(1, 2, 0, 3), atol=1e-4, rtol=1e-4)
