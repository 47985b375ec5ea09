"""The flagship presets start with SmolLM's tokenizer: 49,152 entries and no mask token.

`load_tokenizer` appends `<mask>` (49,153); the presets' `vocab_size: 49153` accepts it and the
model pads its embedding to 49,280 rows (a multiple of `make_vocab_size_divisible_by`, as
Megatron does). The padding rows are never predicted: their logits are -inf, so the loss
equals a cross entropy over the tokenizer's rows only, at TP=1 and TP=2.
"""
from __future__ import annotations

import pytest
import torch

SMOLLM_SIZE = 49152
# The 136m preset at a reduced shape (its vocabulary untouched); 4 heads / 2 groups allow TP=2.
SMALL = dict(num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=64, seq_length=16, attention_backend="sdpa")


def smollm_sized_tokenizer():
    """A fast tokenizer of exactly 49,152 entries, with an eos and no mask token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<unk>": 1}
    vocab.update({f"w{i}": i for i in range(2, SMOLLM_SIZE)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")


def _train_steps(tp: int) -> dict:
    """Build the reduced 136m model for the tokenizer, run 3 SGD steps, check the padding."""
    from megatron.core import parallel_state, tensor_parallel

    from megatron_biglm.data.token_ids import TokenIds
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.model.presets import load_preset
    from megatron_biglm.training.build import check_vocab
    from model_fixtures import build_model, init_megatron

    tokenizer = load_tokenizer(smollm_sized_tokenizer())
    assert tokenizer.mask_token == "<mask>"
    token_ids = TokenIds.from_tokenizer(tokenizer)
    cfg = load_preset("136m", SMALL)
    check_vocab(token_ids, cfg, prefixes=[])  # refused before the presets said 49153
    init_megatron(tp, 1)
    model = build_model(cfg, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, token_ids.vocab_size, (2, 16), generator=g)
    labels = torch.randint(0, token_ids.vocab_size, (2, 16), generator=g)
    labels[0, 0] = token_ids.mask_id  # the appended row is a real, predictable token
    loss_mask = torch.ones(2, 16, dtype=torch.long)
    split = torch.tensor([5, 9])
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = model(ids, split=split, labels=labels, loss_mask=loss_mask).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        per_token = model(ids, split=split, labels=labels, loss_mask=loss_mask)
        logits = model(ids, split=split)  # [b, s, padded / tp], this rank's shard
        full = tensor_parallel.gather_from_tensor_model_parallel_region(logits)
    padded = full[..., token_ids.vocab_size:]
    reference = torch.nn.functional.cross_entropy(
        full[..., :token_ids.vocab_size].float().reshape(-1, token_ids.vocab_size),
        labels.reshape(-1), reduction="none").view(2, 16)
    out = dict(vocab=token_ids.vocab_size, padded=cfg.padded_vocab_size, width=full.shape[-1],
               padded_all_neg_inf=bool(torch.isneginf(padded).all()),
               real_finite=bool(torch.isfinite(full[..., :token_ids.vocab_size]).all()),
               loss_matches=bool(torch.allclose(per_token, reference, atol=1e-4)),
               losses=losses, tp=parallel_state.get_tensor_model_parallel_world_size())
    return out


def worker(tp: int) -> dict:
    """torchrun entry (tests/fixtures/torchrun_util.py)."""
    import sys
    sys.path.insert(0, "tests/fixtures")
    return _train_steps(tp)


def _check(res: dict, tp: int) -> None:
    assert res["tp"] == tp
    assert (res["vocab"], res["padded"], res["width"]) == (SMOLLM_SIZE + 1, 49280, 49280)
    assert res["padded_all_neg_inf"] and res["real_finite"] and res["loss_matches"]
    assert all(torch.isfinite(torch.tensor(res["losses"])))


def test_smollm_sized_tokenizer_starts_the_136m_model_at_tp1():
    import torch.distributed as dist

    from megatron_biglm.common import process_groups

    created = not dist.is_initialized()
    try:
        _check(_train_steps(1), 1)
    finally:  # leave no process group behind (test_config checks that none exists)
        process_groups.destroy(created)


@pytest.mark.slow
def test_smollm_sized_tokenizer_starts_the_136m_model_at_tp2():
    from torchrun_util import run_function

    res = run_function("tests/model/test_vocab_padding.py:worker", nproc=2, kwargs={"tp": 2}, timeout=240).check()
    for rank_result in res.results.values():
        _check(rank_result, 2)


def test_a_tokenizer_larger_than_the_padded_model_is_refused_with_the_fix():
    from megatron_biglm.config import ConfigError
    from megatron_biglm.data.token_ids import TokenIds
    from megatron_biglm.model.presets import load_preset
    from megatron_biglm.training.build import check_vocab

    cfg = load_preset("136m", SMALL)
    with pytest.raises(ConfigError, match="set model.vocab_size=49154"):
        check_vocab(TokenIds(mask_id=49153, vocab_size=49154), cfg, prefixes=[])


def test_the_padded_model_trains_exactly_as_a_cross_entropy_over_the_tokenizer_rows():
    """Gradients too, not only the loss value: every parameter's gradient of the masked-LM loss
    of a model padded from 28 to 128 rows equals that of a plain cross entropy over the 28
    real rows, and the padding rows of the tied embedding get none. (Before the padding rows
    were masked, the tiny instruction-tuning test trained a 128-way softmax: see
    test_instruct_learns.py for what that changed.)"""
    import torch.distributed as dist

    from megatron_biglm.common import process_groups
    from model_fixtures import build_model, init_megatron, tiny_config

    created = not dist.is_initialized()
    try:
        init_megatron(1, 1)
        cfg = tiny_config(vocab_size=28, make_vocab_size_divisible_by=128)
        assert cfg.padded_vocab_size == 128
        model = build_model(cfg, seed=0)
        g = torch.Generator().manual_seed(0)
        ids, labels = torch.randint(0, 28, (2, 2, 12), generator=g)
        loss_mask = (torch.rand(2, 12, generator=g) < 0.5).float()
        split = torch.tensor([0, 5])

        def grads(loss_fn):
            model.zero_grad(set_to_none=True)
            loss_fn().backward()
            return {n: p.grad.clone() for n, p in model.named_parameters()}

        def reference():
            logits = model(ids, split=split)[..., :28].float()  # the tokenizer's rows only
            per_token = torch.nn.functional.cross_entropy(
                logits.reshape(-1, 28), labels.reshape(-1), reduction="none").view(2, 12)
            return (per_token * loss_mask).sum()

        padded = grads(lambda: model(ids, split=split, labels=labels, loss_mask=loss_mask).sum())
        plain = grads(reference)
        for name, grad in padded.items():
            assert torch.allclose(grad, plain[name], atol=1e-5), name
        embedding = padded["embedding.word_embeddings.weight"]
        assert embedding[:28].abs().sum() > 0 and not embedding[28:].any()
    finally:
        process_groups.destroy(created)
