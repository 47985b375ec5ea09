"""BiGLMModel on megatron-core (1 process, CPU): split semantics, backends, sparse loss, init."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model_fixtures import (
    build_model,
    grads_by_name,
    init_megatron,
    mean_masked_loss,
    random_batch,
    tiny_config,
)


@pytest.fixture(scope="module")
def cfg():
    init_megatron(1, 1)
    return tiny_config()


@pytest.fixture(scope="module")
def model(cfg):
    return build_model(cfg, seed=1)


def _hidden(model, ids, split, **kw):
    with torch.no_grad():
        return model(ids, split=split, return_hidden=True, **kw)


# ---------------------------------------------------------------- split mask semantics
def test_suffix_tokens_leave_prefix_hidden_states_exactly_unchanged(model, cfg):
    g = torch.Generator().manual_seed(0)
    for draw in range(6):
        b = batch = random_batch(cfg, 3, 48, seed=draw)
        ids, split = b["input_ids"], batch["split"]
        changed = ids.clone()
        for i, sp in enumerate(split.tolist()):
            changed[i, sp:] = torch.randint(0, cfg.vocab_size, (48 - sp,), generator=g)
        h0, h1 = _hidden(model, ids, split), _hidden(model, changed, split)
        for i, sp in enumerate(split.tolist()):
            assert torch.equal(h0[i, :sp], h1[i, :sp]), f"draw {draw} sample {i} split {sp}"
            if sp < 48:
                assert not torch.allclose(h0[i, sp:], h1[i, sp:])


def test_prefix_tokens_change_every_suffix_position(model, cfg):
    for draw in range(4):
        b = random_batch(cfg, 2, 40, seed=100 + draw)
        changed = b["input_ids"].clone()
        changed[:, 0] = (changed[:, 0] + 1) % cfg.vocab_size  # first token: always in the prefix
        h0, h1 = _hidden(model, b["input_ids"], b["split"]), _hidden(model, changed, b["split"])
        for i, sp in enumerate(b["split"].tolist()):
            diff = (h0[i, sp:] - h1[i, sp:]).abs().amax(dim=-1)
            assert bool((diff > 0).all()), f"suffix positions of sample {i} ignored the prefix"


def test_no_attn_lets_suffix_tokens_change_prefix_positions(model, cfg):
    b = random_batch(cfg, 2, 40, seed=7)
    changed = b["input_ids"].clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab_size  # last token: always in the suffix
    h0, h1 = _hidden(model, b["input_ids"], None), _hidden(model, changed, None)
    for i, sp in enumerate(b["split"].tolist()):
        diff = (h0[i, :sp] - h1[i, :sp]).abs().amax(dim=-1)
        assert bool((diff > 0).all()), "full attention (no_attn/mlm) must see the suffix"
    # ...and with the split applied the same change leaves the prefix alone.
    s0, s1 = _hidden(model, b["input_ids"], b["split"]), _hidden(model, changed, b["split"])
    for i, sp in enumerate(b["split"].tolist()):
        assert torch.equal(s0[i, :sp], s1[i, :sp])


def test_right_padding_matches_the_unpadded_sample(model, cfg):
    b = random_batch(cfg, 2, 40, seed=11)
    lengths = torch.tensor([40, 29])
    split = torch.tensor([12, 9])
    padded = b["input_ids"].clone()
    padded[1, 29:] = 0
    h = _hidden(model, padded, split, valid_lengths=lengths)
    alone = _hidden(model, b["input_ids"][1:2, :29], split[1:2])
    torch.testing.assert_close(h[1, :29], alone[0], atol=1e-5, rtol=1e-5)
    # padding with no split = full attention over the valid keys only
    h_full = _hidden(model, padded, None, valid_lengths=lengths)
    alone_full = _hidden(model, b["input_ids"][1:2, :29], None)
    torch.testing.assert_close(h_full[1, :29], alone_full[0], atol=1e-5, rtol=1e-5)


def _attention_params_seen(model, ids, **kw):
    """What the first layer's core attention received as `packed_seq_params` in a forward."""
    seen = []
    core = model.decoder.layers[0].self_attention.core_attention
    hook = core.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["packed_seq_params"]), with_kwargs=True)
    try:
        _hidden(model, ids, **kw)
    finally:
        hook.remove()
    return seen[0]


def test_lengths_that_pad_no_row_run_plain_full_attention(model, cfg):
    """valid_lengths all = seq_len is no padding: the same forward as valid_lengths=None (no
    mask reaches the attention, with or without a restricting split), the same logits."""
    for draw in range(3):
        b = random_batch(cfg, 3, 24 + 8 * draw, seed=300 + draw)
        ids, split = b["input_ids"], b["split"]
        full = torch.full((ids.shape[0],), ids.shape[1])
        for use_split in (None, torch.zeros_like(split), split):
            given_full = _hidden(model, ids, use_split, valid_lengths=full)
            torch.testing.assert_close(given_full, _hidden(model, ids, use_split), atol=0, rtol=0)
        params = _attention_params_seen(model, ids, split=None, valid_lengths=full)
        assert params.is_full_attention and params.derived is None
        with torch.no_grad():
            torch.testing.assert_close(model(ids, split=None, valid_lengths=full), model(ids, split=None),
                                       atol=0, rtol=0)
        restricted = _attention_params_seen(model, ids, split=split, valid_lengths=full)
        bare = _attention_params_seen(model, ids, split=split)
        assert torch.equal(restricted.derived, bare.derived)


def test_one_padded_row_still_builds_the_mask_and_keeps_its_valid_positions(model, cfg):
    b = random_batch(cfg, 3, 32, seed=310)
    ids = b["input_ids"].clone()
    lengths = torch.tensor([32, 21, 32])
    ids[1, 21:] = 0
    params = _attention_params_seen(model, ids, split=None, valid_lengths=lengths)
    assert params.derived is not None and params.derived.shape == (3, 1, 32, 32)
    h = _hidden(model, ids, None, valid_lengths=lengths)
    alone = _hidden(model, ids[1:2, :21], None)
    torch.testing.assert_close(h[1, :21], alone[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h[0], _hidden(model, ids[0:1], None)[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- backends
def _loss_and_grads(model, batch, backend):
    model.zero_grad(set_to_none=True)
    loss = mean_masked_loss(model, batch, backend)
    loss.backward()
    grads = grads_by_name(model)
    model.attention_backend = "sdpa"
    return loss.detach(), grads


def _assert_backends_agree(model, batch, backend, tol=1e-5):
    """Loss and every parameter gradient of `backend` equal the sdpa reference's."""
    ref_loss, ref_grads = _loss_and_grads(model, batch, "sdpa")
    loss, grads = _loss_and_grads(model, batch, backend)
    assert abs(loss.item() - ref_loss.item()) < tol, backend
    assert set(grads) == set(ref_grads) and len(grads) == len(list(model.parameters()))
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=tol, rtol=10 * tol, msg=name)


@pytest.mark.parametrize("split_kind", ["split", "full"])
def test_local_megatron_attention_matches_sdpa_loss_and_grads(model, cfg, split_kind):
    batch = random_batch(cfg, 3, 64, seed=21)
    if split_kind == "full":
        batch["split"] = None
    _assert_backends_agree(model, batch, "local")


def test_flex_matches_sdpa_forward_on_cpu(model, cfg):
    """FlexAttention has no CPU backward in torch (2.13); its gradients are checked on CUDA."""
    for seed in (31, 32):
        batch = random_batch(cfg, 3, 100, seed=seed)  # 100: not a multiple of the block size
        with torch.no_grad():
            ref = mean_masked_loss(model, batch, "sdpa")
            h_ref = model(batch["input_ids"], split=batch["split"], return_hidden=True)
            flex = mean_masked_loss(model, batch, "flex")
            h_flex = model(batch["input_ids"], split=batch["split"], return_hidden=True)
        model.attention_backend = "sdpa"
        assert abs(flex.item() - ref.item()) < 1e-5
        torch.testing.assert_close(h_flex, h_ref, atol=1e-5, rtol=1e-5)


def test_flash_path_with_varlen_emulation_matches_sdpa(model, cfg, monkeypatch):
    """The flash backend's layout handling and two-call split, with flash-attn's kernels
    replaced by exact SDPA emulations (the real kernels need CUDA; see the gpu test)."""
    from megatron_biglm.model.attention_backends import flash as flash_backend
    from megatron_biglm.model.attention_masks import sdpa_varlen_attention

    def full(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False):
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale,
            enable_gqa=True)
        return out.transpose(1, 2)

    def varlen(*args, dropout_p=0.0, **kwargs):
        return sdpa_varlen_attention(*args, **kwargs)

    monkeypatch.setattr(flash_backend, "flash_attn_functions", lambda: (full, varlen))
    for split_kind in ("split", "full"):
        batch = random_batch(cfg, 3, 50, seed=41)
        if split_kind == "full":
            batch["split"] = None
        _assert_backends_agree(model, batch, "flash")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_backends_match_sdpa_loss_and_grads():
    from megatron_biglm.model.attention_params import flash_attn_available

    init_megatron(1, 1)
    cfg = tiny_config()
    model = build_model(cfg, seed=3).cuda()
    batch = {k: v.cuda() for k, v in random_batch(cfg, 4, 256, seed=5).items()}
    _assert_backends_agree(model, batch, "flex", tol=1e-4)
    if flash_attn_available():  # flash-attn computes in bf16/fp16 only: compare in bf16
        model = build_model(cfg, seed=3, params_dtype="bf16").cuda().bfloat16()
        ref_loss, ref_grads = _loss_and_grads(model, batch, "sdpa")
        loss, grads = _loss_and_grads(model, batch, "flash")
        assert abs(loss.item() - ref_loss.item()) < 2e-2 * abs(ref_loss.item())
        for name, grad in grads.items():
            cos = F.cosine_similarity(grad.float().flatten(), ref_grads[name].float().flatten(), dim=0)
            assert cos > 0.99, name


def test_flash_without_flash_attn_fails_clearly(cfg):
    from megatron_biglm.model.attention_params import flash_attn_available, resolve_backend

    if flash_attn_available():
        pytest.skip("flash-attn is installed")
    with pytest.raises(ImportError, match="pip install flash-attn"):
        resolve_backend("flash")
    assert resolve_backend("auto") == ("flex" if torch.cuda.is_available() else "sdpa")


# ---------------------------------------------------------------- loss
def test_sparse_prediction_loss_equals_full_logits_masked_loss(model, cfg):
    for seed in range(4):
        batch = random_batch(cfg, 3, 64, seed=50 + seed, mask_prob=0.15 + 0.2 * seed)
        batch["loss_mask"][0] = 0  # a sample with nothing to predict
        model.zero_grad(set_to_none=True)
        sparse = mean_masked_loss(model, batch)
        sparse.backward()
        sparse_grads = grads_by_name(model)

        model.zero_grad(set_to_none=True)
        logits = model(batch["input_ids"], split=batch["split"])
        assert logits.shape == (3, 64, cfg.padded_vocab_size)
        per_token = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), batch["labels"].reshape(-1), reduction="none"
        ).view(3, 64)
        mask = batch["loss_mask"].float()
        full = (per_token * mask).sum() / mask.sum()
        full.backward()
        assert abs(sparse.item() - full.item()) < 1e-6
        for name, grad in grads_by_name(model).items():
            torch.testing.assert_close(sparse_grads[name], grad, atol=1e-6, rtol=1e-5)


def test_per_token_loss_is_zero_off_the_mask_and_reduces_like_megatron(model, cfg):
    from megatron_biglm.model.loss import masked_lm_loss_func

    batch = random_batch(cfg, 2, 32, seed=60)
    with torch.no_grad():
        losses = model(batch["input_ids"], split=batch["split"], labels=batch["labels"],
                       loss_mask=batch["loss_mask"])
    assert losses.shape == (2, 32) and losses.dtype == torch.float32
    assert torch.equal(losses[batch["loss_mask"] == 0], torch.zeros(int((batch["loss_mask"] == 0).sum())))
    assert bool((losses[batch["loss_mask"] == 1] > 0).all())
    total, count, report = masked_lm_loss_func(batch["loss_mask"], losses)
    assert int(count) == int(batch["loss_mask"].sum())
    torch.testing.assert_close(total, losses.sum())
    torch.testing.assert_close(report["lm loss"], torch.stack([losses.sum(), count.float()]))


def test_no_masked_tokens_gives_zero_loss_and_finite_grads(model, cfg):
    batch = random_batch(cfg, 2, 32, seed=61)
    model.zero_grad(set_to_none=True)
    losses = model(batch["input_ids"], split=batch["split"], labels=batch["labels"],
                   loss_mask=torch.zeros_like(batch["loss_mask"]))
    assert torch.equal(losses, torch.zeros(2, 32))
    losses.sum().backward()
    for grad in grads_by_name(model).values():
        assert torch.equal(grad, torch.zeros_like(grad))


def test_bad_inputs_fail_with_instructions(model, cfg):
    batch = random_batch(cfg, 2, 16, seed=62)
    with pytest.raises(ValueError, match="loss_mask"):
        model(batch["input_ids"], split=batch["split"], labels=batch["labels"])
    with pytest.raises(ValueError, match="position_ids=None"):
        model(batch["input_ids"], torch.arange(16).expand(2, 16), split=batch["split"])
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        model(batch["input_ids"], split=batch["split"], labels=batch["labels"][:, :8],
              loss_mask=batch["loss_mask"][:, :8])
    with pytest.raises(ValueError, match="split must lie"):
        model(batch["input_ids"], split=torch.tensor([3, 99]))


# ---------------------------------------------------------------- architecture
def test_architecture_has_no_bias_tied_embeddings_and_preset_init(cfg):
    big = tiny_config(hidden_size=256, num_attention_heads=4, ffn_hidden_size=512,
                      vocab_size=2048, num_layers=4, init_method_std=0.013)
    model = build_model(big, seed=4)
    params = dict(model.named_parameters())
    assert not [n for n in params if n.endswith("bias")]
    assert "output_layer.weight" not in params  # tied: the output uses the embedding
    assert model.shared_embedding_or_output_weight() is params["embedding.word_embeddings.weight"]
    std = 0.013
    assert abs(params["embedding.word_embeddings.weight"].std().item() - std) < 0.03 * std
    assert abs(params["decoder.layers.0.mlp.linear_fc1.weight"].std().item() - std) < 0.03 * std
    scaled = std / (2 * big.num_layers) ** 0.5
    assert abs(params["decoder.layers.0.self_attention.linear_proj.weight"].std().item() - scaled) < 0.05 * scaled
    for name, p in params.items():
        if "layernorm" in name:
            assert torch.equal(p, torch.ones_like(p)), name


def test_dropout_is_off_by_default_and_configurable(cfg):
    batch = random_batch(cfg, 2, 32, seed=70)
    for dropout, expect_equal in ((0.0, True), (0.2, False)):
        m = build_model(tiny_config(hidden_dropout=dropout, attention_dropout=dropout), seed=5)
        m.train()
        with torch.no_grad():
            a = m(batch["input_ids"], split=batch["split"], return_hidden=True)
            b = m(batch["input_ids"], split=batch["split"], return_hidden=True)
        assert torch.equal(a, b) == expect_equal
        m.eval()
        with torch.no_grad():
            assert torch.equal(m(batch["input_ids"], split=batch["split"], return_hidden=True),
                               m(batch["input_ids"], split=batch["split"], return_hidden=True))


def test_rope_makes_positions_matter_and_gqa_shapes(model, cfg):
    """Bidirectional attention without positions would be permutation-equivariant."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    perm = torch.tensor([3, 1, 7, 0, 2, 6, 4, 5])
    h = _hidden(model, ids, None)
    hp = _hidden(model, ids[:, perm], None)
    assert not torch.allclose(h[:, perm], hp, atol=1e-4)
    qkv = dict(model.named_parameters())["decoder.layers.0.self_attention.linear_qkv.weight"]
    d = cfg.head_dim
    assert qkv.shape == ((cfg.num_attention_heads + 2 * cfg.query_groups) * d, cfg.hidden_size)


def test_each_backend_gets_only_its_mask_and_fast_paths_have_no_s_by_s_tensor():
    import dataclasses

    from megatron_biglm.model.attention_params import build_attention_params

    s, split = 1024, torch.tensor([100, 700, 1023])
    dense = build_attention_params(split, s, "sdpa")
    assert isinstance(dense.derived, torch.Tensor) and dense.derived.shape == (3, 1, s, s)
    flex = build_attention_params(split, s, "flex")
    flash = build_attention_params(split, s, "flash")
    for held in (
        [t for t in flex.derived.block_mask.as_tuple() if isinstance(t, torch.Tensor)],
        [getattr(flash.derived, f.name) for f in dataclasses.fields(flash.derived)
         if isinstance(getattr(flash.derived, f.name), torch.Tensor)],
    ):
        assert len(held) >= 4 and max(t.numel() for t in held) < s * s
    assert build_attention_params(None, s, "flex").is_full_attention


@pytest.mark.parametrize("recompute", [
    dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    dict(recompute_granularity="selective", recompute_modules=["core_attn"]),
])
def test_activation_recompute_carries_the_mask_and_matches(cfg, recompute):
    """The mask travels in packed_seq_params precisely so that megatron's recompute works."""
    batch = random_batch(cfg, 2, 40, seed=80)
    results = []
    for extra in ({}, recompute):
        m = build_model(cfg, seed=6, **extra)
        results.append(_loss_and_grads(m, batch, "sdpa"))
    (loss0, grads0), (loss1, grads1) = results
    assert loss0.item() == loss1.item()
    for name in grads0:
        torch.testing.assert_close(grads1[name], grads0[name], atol=1e-7, rtol=1e-6)


def test_bf16_model_tracks_the_fp32_model(cfg):
    batch = random_batch(cfg, 2, 48, seed=90)
    fp32 = build_model(cfg, seed=7)
    bf16 = build_model(cfg, seed=7, params_dtype="bf16")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        for p16, p32 in zip(bf16.parameters(), fp32.parameters()):
            p16.copy_(p32)
        l32 = mean_masked_loss(fp32, batch)
        l16 = mean_masked_loss(bf16, batch)
    assert abs(l16.item() - l32.item()) < 0.02 * l32.item()


def test_distributed_checkpoint_keys_use_the_megatron_layout(model):
    """dist_checkpointing keys stack layers and store norms under Transformer Engine's fused
    names, so checkpoints interchange with megatron's own GPT layouts."""
    keys = {v.key for v in model.sharded_state_dict().values()}
    assert {"decoder.layers.self_attention.linear_qkv.layer_norm_weight",
            "decoder.layers.mlp.linear_fc1.layer_norm_weight",
            "decoder.layers.self_attention.linear_qkv.weight",
            "decoder.final_layernorm.weight", "embedding.word_embeddings.weight"} <= keys
