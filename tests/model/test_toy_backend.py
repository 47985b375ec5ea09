"""A new attention backend is one file and one registry line: a toy backend written here into
its own module (outside the package), registered with `register_backend`, trains the tiny
preset through the one loop, and its losses equal `sdpa`'s bit for bit.

The toy backend derives its own mask from the split rule (`visible`, on the host, then moved)
and runs plain SDPA over it: the same arithmetic as `sdpa`, reached only through the registry.
"""
from __future__ import annotations

import importlib
import textwrap

import pytest
import torch

from megatron_biglm.model import attention_backends
from megatron_biglm.model.attention_backends import registry
from megatron_biglm.model.config import ModelConfigError
from train_fixtures import loss_and_grad_norm, tiny_overrides, train_data  # noqa: F401 (fixture)

TOY_BACKEND = '''
"""A toy attention backend: SDPA over a dense mask it derives from the split rule."""
import torch
import torch.nn.functional as F

from megatron_biglm.objective.split_rule import visible


class ToyBackend:
    name = "toy"
    dtypes = None
    supports_dropout = True
    megatron_native = False
    derived_on = []  # the devices its masks were derived for: proof the registry called it

    def unavailable(self, *, training=True):
        return None

    def derive(self, split, options):
        pos = torch.arange(split.seq_len)
        allowed = visible(pos.view(1, -1, 1), pos.view(1, 1, -1), split.split.view(-1, 1, 1),
                          split.valid.view(-1, 1, 1))
        self.derived_on.append(options.device)
        return allowed.unsqueeze(1).to(options.device)

    def forward(self, core, query, key, value, derived):
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=derived, dropout_p=core.attention_dropout_p(),
                                             scale=core.softmax_scale, enable_gqa=q.shape[1] != k.shape[1])
        return out.permute(2, 0, 1, 3)

    def describe(self, dtype, options):
        return "a toy: SDPA over the mask it derives"
'''


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    """The toy backend's module, importable as `toy_attention`; the registry restored after."""
    (tmp_path / "toy_attention.py").write_text(textwrap.dedent(TOY_BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "BACKENDS", dict(registry.BACKENDS))
    module = importlib.import_module("toy_attention")
    yield module
    monkeypatch.delitem(__import__("sys").modules, "toy_attention")


def test_toy_backend_registered_in_one_line_trains_like_sdpa(toy_module, train_data, tmp_path):  # noqa: F811
    from megatron_biglm.cli.train import train

    attention_backends.register_backend(toy_module.ToyBackend())  # the one line

    def run(backend):
        run_dir = tmp_path / backend
        train(None, tiny_overrides(train_data, run_dir, steps=4, **{"model.attention_backend": backend}))
        return loss_and_grad_norm(run_dir)

    toy = run("toy")
    assert toy_module.ToyBackend.derived_on  # the registry's backend derived the masks
    assert toy == run("sdpa") and len(toy) == 4


def test_toy_backend_named_as_module_class_in_the_config(toy_module):
    from model_fixtures import tiny_config

    cfg = tiny_config(attention_backend="toy_attention:ToyBackend")
    assert attention_backends.resolve_backend(cfg.attention_backend, torch.float32) == "toy_attention:ToyBackend"
    from megatron_biglm.model.kernels import kernel_report

    assert "a toy" in kernel_report(cfg.attention_backend, torch.float32).attention


def test_toy_backend_names_are_checked_with_did_you_mean(toy_module):
    from model_fixtures import tiny_config

    with pytest.raises(ModelConfigError, match="did you mean 'sdpa_split'"):
        tiny_config(attention_backend="sdpa_splt")
    with pytest.raises(ModelConfigError, match="cannot import"):
        tiny_config(attention_backend="toy_attention:Missing")
    with pytest.raises(TypeError, match="not an AttentionBackend"):
        attention_backends.register_backend(object())


def test_toy_backend_auto_is_a_preference_list_over_the_registered(toy_module, monkeypatch):
    """`auto` takes the first preferred backend that runs here in the dtype and dropout."""
    attention_backends.register_backend(toy_module.ToyBackend())
    monkeypatch.setattr(registry, "AUTO_PREFERENCE", ["flash", "toy", "sdpa"])
    assert attention_backends.resolve_backend("auto", torch.float32) == "toy"  # flash: fp16/bf16 only
