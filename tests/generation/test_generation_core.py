"""Mask-Predict decoding against loop references, a scripted model and
a tiny random EuroBERT-layout BiGLM behind the HF adapter.

What must hold: the re-masking schedule floor(N(T-t)/T) and its choice of slots; the length
beam's winner; cached == uncached (same ids, probabilities within 1e-5) for plain and block-wise
decoding; determinism by seed; batch invariance; the EOS and `until` cuts; clear errors.
"""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest
import torch
from eval_fixtures import one_torch_thread, tiny_biglm  # noqa: F401 - fixture
from generation_fakes import (BOS, EOS, MASK, SPECIAL, BlockCausalReference, BruteForceModel,
                              CharTokenizer, ScriptedAdapter, reference_mask_predict)

from megatron_biglm.generation import (GenerationConfig, GenerationConfigError,
                                       MaskPredictGenerator, render_canvas)

from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
from megatron_biglm.model.heads import LengthCandidates

HF_VOCAB = 40
TOL = 1e-5


def scripted(**kwargs):
    adapter = ScriptedAdapter(**kwargs)
    return adapter, MaskPredictGenerator(adapter, CharTokenizer(adapter.vocab))


@pytest.fixture(scope="module")
def hf_model():
    return tiny_biglm(HF_VOCAB, SPECIAL, seed=7)


def hf_generator(model, cache: str) -> MaskPredictGenerator:
    adapter = HFMaskedLMAdapter(model, SPECIAL, prefix_cache=cache)
    assert adapter.prefix_cache == (cache == "on")
    return MaskPredictGenerator(adapter, CharTokenizer(HF_VOCAB))


def random_prompts(seed, count, alphabet="abcdefghijklmnopqrstuvwxyz0123456789 .,"[:HF_VOCAB - 5]):
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(count)]


# ---------------------------------------------------------------------------- the schedule

@pytest.mark.parametrize("n,steps", [(7, 4), (10, 10), (5, 3), (2, 5), (1, 1), (9, 1)])
@pytest.mark.parametrize("remask", ["low_confidence", "none"])
def test_remask_counts_and_choice_follow_mask_predict(n, steps, remask):
    adapter, gen = scripted()
    out, = gen.generate(["abc"], GenerationConfig(length=n, steps=steps, remask=remask, return_steps=True))
    tokens, logp, canvases, iterations = reference_mask_predict(adapter, [BOS, 5, 6, 7], n, steps, remask)
    masked_counts = [sum(tok == MASK for tok in step.ids) for step in out.steps]
    assert masked_counts == [n * (steps - t) // steps for t in range(1, len(out.steps) + 1)]
    assert [list(step.ids) for step in out.steps] == canvases  # which slots: the reference's
    assert [step.iteration for step in out.steps] == list(range(1, iterations + 1))
    # a row with nothing left masked stops early: N=2, T=5 is done after t=3
    assert out.iterations == iterations == next(t for t in range(1, steps + 1) if n * (steps - t) // steps == 0)
    assert out.ids == tokens
    assert out.confidence == pytest.approx([math.exp(x) for x in logp], abs=1e-12)
    if remask == "none":  # LLaDA: a committed slot never changes again
        for before, after in zip(out.steps, out.steps[1:]):
            assert all(a == b for a, b in zip(before.ids, after.ids) if a != MASK)


def test_low_confidence_remask_can_revise_committed_tokens():
    """Mask-Predict re-masks from all slots; on the scripted model some slot's token changes
    after it was first committed (LLaDA's `none` would never do that)."""
    adapter, gen = scripted()
    revised = 0
    for prompt in ("abc", "hello", "xyz", "mask"):
        out, = gen.generate([prompt], GenerationConfig(length=10, steps=10, return_steps=True))
        first = {}
        for step in out.steps:
            for j, tok in enumerate(step.ids):
                if tok != MASK:
                    revised += j in first and first[j] != tok
                    first.setdefault(j, tok)
    assert revised > 0


def test_confidence_threshold_commits_every_slot_above_it():
    adapter, gen = scripted()
    prefix = [BOS, 5, 6, 7]
    for threshold in (0.3, 0.6):
        out, = gen.generate(["abc"], GenerationConfig(length=8, steps=8, return_steps=True,
                                                      confidence_threshold=threshold))
        tokens, logp, canvases, iterations = reference_mask_predict(adapter, prefix, 8, 8,
                                                                    threshold=threshold)
        assert [list(s.ids) for s in out.steps] == canvases and out.ids == tokens
    everything, = gen.generate(["abc"], length=8, steps=8, confidence_threshold=1e-9)
    assert everything.iterations == 1  # all slots pass: one step, the one-shot argmax fill
    assert everything.ids == reference_mask_predict(adapter, prefix, 8, 1)[0]


# ---------------------------------------------------------------------------- length

def test_length_beam_picks_highest_mean_logprob():
    adapter, gen = scripted()
    for prompt in ("abc", "kite", "zztop"):
        out, = gen.generate([prompt], length=6, length_beam=4, steps=3)
        assert [n for n, _ in out.candidates] == [6, 5, 7, 4]
        alone = {n: gen.generate([prompt], length=n, steps=3)[0] for n in (6, 5, 7, 4)}
        for n, score in out.candidates:  # each candidate decodes as it would alone
            assert score == pytest.approx(sum(map(math.log, alone[n].confidence)) / n, abs=1e-12)
        best = max(out.candidates, key=lambda c: c[1])[0]
        assert out.length == best and out.ids == alone[best].ids


def test_length_predictor_hook_supplies_candidates():
    adapter, _ = scripted()
    seen = []

    def predict(prefix_ids, prefix_lengths, k):
        seen.append((prefix_ids.tolist(), prefix_lengths.tolist(), k))
        return LengthCandidates(torch.tensor([[9, 3], [2, 2]]), torch.tensor([[-0.5, -1.0], [-1.0, -2.0]]))

    gen = MaskPredictGenerator(adapter, CharTokenizer(adapter.vocab), length_predictor=predict)
    a, b = gen.generate(["ab", "c"], max_new_tokens=5, length_beam=2, steps=2)
    assert seen == [([[BOS, 5, 6], [BOS, 7, 0]], [3, 2], 2)]
    assert [n for n, _ in a.candidates] == [5, 3]  # 9 capped at max_new_tokens
    assert [n for n, _ in b.candidates] == [2]  # duplicates merged
    with pytest.raises(GenerationConfigError, match="no length head"):
        MaskPredictGenerator(adapter, CharTokenizer(adapter.vocab)).generate(["ab"], max_new_tokens=5,
                                                                             length_beam=2)


def test_length_beam_score_adds_the_predictor_log_probability():
    """score = mean token log-probability + log p(length); the winner is the best score, so a
    length the head is sure of beats a shorter one the tokens are as sure of."""
    adapter, _ = scripted()
    head = torch.tensor([[-0.1, -3.0, -4.0]])
    gen = MaskPredictGenerator(adapter, CharTokenizer(adapter.vocab), length_predictor=lambda ids, lengths, k:
                               LengthCandidates(torch.tensor([[6, 4, 5]]), head))
    out, = gen.generate(["abc"], max_new_tokens=8, length_beam=3, steps=3)
    alone = {n: gen.generate(["abc"], length=n, steps=3)[0] for n in (6, 4, 5)}
    assert [n for n, _ in out.candidates] == [6, 4, 5]
    for (n, score), logp in zip(out.candidates, head[0].tolist()):
        assert score == pytest.approx(sum(map(math.log, alone[n].confidence)) / n + logp, abs=1e-9)
    assert out.length == max(out.candidates, key=lambda c: c[1])[0]


def test_an_adapter_with_a_length_head_supplies_the_candidates():
    adapter = ScriptedAdapter()
    adapter.predict_lengths = lambda ids, lengths, k: LengthCandidates(
        torch.tensor([[4, 2, 6][:k]] * len(lengths)), torch.zeros(len(lengths), k))
    gen = MaskPredictGenerator(adapter, CharTokenizer(32))
    out, = gen.generate(["abc"], length_beam=3, steps=2)  # no length given: the head decides
    assert [n for n, _ in out.candidates] == [4, 2, 6] and out.length in (4, 2, 6)


def test_eos_cut_only_with_max_new_tokens_and_min_length_suppresses_it():
    adapter, gen = scripted(eos_at=7)  # slot 3 after [BOS] a b c
    cut, = gen.generate(["abc"], max_new_tokens=8, steps=4)
    assert cut.finish_reason == "eos" and len(cut.ids) == 3 and EOS not in cut.ids
    kept, = gen.generate(["abc"], length=8, steps=4)
    assert kept.finish_reason == "length" and len(kept.ids) == 8 and kept.ids[3] == EOS
    assert kept.ids[:3] == cut.ids  # the same decode, only the cut differs
    late, = gen.generate(["abc"], max_new_tokens=8, steps=4, min_length=5)
    assert EOS not in late.ids[:5] and len(late.ids) >= 5


def test_eos_in_a_block_stops_the_later_blocks():
    adapter, gen = scripted(eos_at=7)  # slot 3 after [BOS] a b c
    out, = gen.generate(["abc"], max_new_tokens=12, steps=2, block_size=2, return_steps=True)
    assert out.ids == out.ids[:3] and {s.block for s in out.steps} == {0, 1}
    assert adapter.count("encode_prefix") == 2  # the prompt, then prompt + block 0; no block 2


# ---------------------------------------------------------------------------- blocks

def test_refresh_blocks_re_encode_once_per_block_and_run_only_slot_rows():
    adapter, gen = scripted()
    out, = gen.generate(["abcd"], length=7, steps=3, block_size=3, return_steps=True)
    assert adapter.count("logits") == 0 and adapter.count("encode_prefix") == 3  # blocks 3+3+1
    suffix_widths = [len(c[1][0]) for c in adapter.calls if c[0] == "logits_with_prefix"]
    assert suffix_widths == [3, 3, 3, 3, 3, 3, 1]  # the last block of 1 slot is done after t=1
    # block k is decoded after [BOS] + prompt + blocks < k, exactly as a one-block decode there
    prefix = [BOS, 5, 6, 7, 8]
    for k, width in enumerate((3, 3, 1)):
        tokens = reference_mask_predict(adapter, prefix, width, 3)[0]
        assert out.ids[3 * k:3 * k + width] == tokens
        prefix += tokens
    assert all(len(s.ids) == 7 for s in out.steps)
    assert all(tok == MASK for s in out.steps if s.block == 0 for tok in s.ids[3:])


def test_cached_blocks_extend_the_cache_with_each_frozen_block():
    """The scripted model's prefix state is its tokens, so block-causal and refresh decoding give
    the same ids; what differs is the cost: one encode, then one extension per frozen block."""
    adapter, gen = scripted()
    cached = gen.generate(["abcd", "xy"], length=7, steps=3, block_size=3, blocks="cached")
    assert adapter.count("encode_prefix") == 1
    extends = [c for c in adapter.calls if c[0] == "extend_prefix"]
    assert [len(c[2][0]) for c in extends] == [3, 3]
    assert [list(b) for b in extends[0][2]] == [o.ids[:3] for o in cached]
    refresh = gen.generate(["abcd", "xy"], length=7, steps=3, block_size=3, blocks="refresh")
    assert [o.ids for o in cached] == [o.ids for o in refresh]


class _NoExtension(ScriptedAdapter):
    def extend_prefix(self, state, rows, block_ids, block_lengths):
        raise NotImplementedError("no block-causal cache here")


def test_cached_blocks_need_extend_prefix():
    for adapter in (ScriptedAdapter(prefix_cache=False), _NoExtension()):
        gen = MaskPredictGenerator(adapter, CharTokenizer(adapter.vocab))
        with pytest.raises(ValueError, match="blocks='refresh'"):
            gen.generate(["ab"], length=4, block_size=2, blocks="cached")


# ---------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("options", [
    dict(steps=4),
    dict(steps=3, block_size=3),
    dict(steps=3, temperature=1.0, top_k=8, top_p=0.9, remask="random", length_beam=3),
    dict(steps=5, block_size=4, remask="none", confidence_threshold=0.2),
], ids=["plain", "refresh-blocks", "sampled-beam", "blocks-none-threshold"])
def test_cached_equals_uncached_on_a_real_model(hf_model, options):
    cached, uncached = hf_generator(hf_model, "on"), hf_generator(hf_model, "off")
    rng = random.Random(3)
    for trial in range(3):
        prompts = random_prompts(trial, 4)
        config = GenerationConfig(length=rng.randint(2, 10), seed=trial, **options)
        a = cached.generate(prompts, config, batch_size=3)
        b = uncached.generate(prompts, config, batch_size=3)
        for x, y in zip(a, b):
            assert x.ids == y.ids and x.iterations == y.iterations
            assert x.confidence == pytest.approx(y.confidence, abs=TOL)
            assert [s for _, s in x.candidates] == pytest.approx([s for _, s in y.candidates], abs=TOL)


@pytest.mark.parametrize("block_size", [None, 3])
def test_real_model_decode_equals_unpadded_loop_reference(hf_model, block_size):
    """Batched, padded, cached decoding of a float64 model == one unpadded forward per slot with
    a loop-built split mask, block after block ([BOS] + prompt + finished blocks as prefix)."""
    import copy

    model = copy.deepcopy(hf_model).double()
    gen = hf_generator(model, "on")
    reference = BruteForceModel(model)
    prompts = random_prompts(8, 3)
    outs = gen.generate(prompts, length=7, steps=3, block_size=block_size, batch_size=3)
    for prompt, out in zip(prompts, outs):
        prefix, tokens, logp = [BOS] + CharTokenizer(HF_VOCAB)(prompt)["input_ids"], [], []
        for start in range(0, 7, block_size or 7):
            width = min(block_size or 7, 7 - start)
            block, block_logp, _, _ = reference_mask_predict(reference, prefix + tokens, width, 3)
            tokens, logp = tokens + block, logp + block_logp
        assert out.ids == tokens
        assert out.confidence == pytest.approx([math.exp(x) for x in logp], abs=1e-9)


def test_block_causal_decoding_differs_from_refresh_on_a_real_model(hf_model):
    """On a real model the two block semantics are different computations (prompt rows see the
    finished blocks only under refresh), so the exactness test below compares like with like."""
    import copy

    model = copy.deepcopy(hf_model).double()
    reference = MaskPredictGenerator(BlockCausalReference(model), CharTokenizer(HF_VOCAB))
    refresh = hf_generator(model, "off")
    prompts = random_prompts(17, 3)
    one_block = dict(length=6, steps=3, block_size=6)
    for a, b in zip(reference.generate(prompts, blocks="cached", **one_block),
                    refresh.generate(prompts, **one_block)):
        assert a.ids == b.ids and a.confidence == pytest.approx(b.confidence, abs=1e-9)
    blocks = dict(length=8, steps=3, block_size=3)
    causal = reference.generate(prompts, blocks="cached", **blocks)
    fresh = refresh.generate(prompts, **blocks)
    assert any(a.confidence[3:] != pytest.approx(b.confidence[3:], abs=1e-6) for a, b in zip(causal, fresh))


def _extends(adapter) -> bool:
    try:
        state = adapter.encode_prefix(torch.tensor([[BOS, 5]]), torch.tensor([2]))
        adapter.extend_prefix(state, torch.tensor([0]), torch.tensor([[6]]), torch.tensor([1]))
    except (AttributeError, NotImplementedError):
        return False
    return True


def test_cached_blocks_equal_the_block_causal_reference(hf_model):
    """blocks="cached" through the adapter's extend_prefix == the recomputing reference (same
    ids, probabilities within 1e-5 in fp32), over random prompts and lengths."""
    gen = hf_generator(hf_model, "on")
    assert _extends(gen.adapter), f"{type(gen.adapter).__name__} does not extend a prefix block by block"
    reference = MaskPredictGenerator(BlockCausalReference(hf_model), CharTokenizer(HF_VOCAB))
    rng = random.Random(9)
    for trial in range(3):
        prompts = random_prompts(30 + trial, 3)
        config = GenerationConfig(length=rng.randint(4, 9), steps=3, block_size=rng.randint(2, 3),
                                  blocks="cached", length_beam=2, seed=trial)
        for x, y in zip(gen.generate(prompts, config), reference.generate(prompts, config)):
            assert x.ids == y.ids
            assert x.confidence == pytest.approx(y.confidence, abs=TOL)


@pytest.mark.parametrize("block_size", [2, 3, 5])
def test_block_causal_without_cache_equals_the_cache_token_for_token(hf_model, block_size):
    """(a) blocks="cached" through the prefix cache and (b) the same attention recomputed from
    the ids every iteration (`block_causal_logits`, a 4D mask) give the same ids; the cached
    path never runs a full forward, the uncached one never touches a cache."""
    cached, uncached = hf_generator(hf_model, "on"), hf_generator(hf_model, "off")
    rng = random.Random(block_size)
    for trial in range(3):
        prompts = random_prompts(60 + trial, 4)
        config = GenerationConfig(length=rng.randint(block_size + 1, 12), steps=3, block_size=block_size,
                                  blocks="cached", length_beam=2, seed=trial)
        for x, y in zip(cached.generate(prompts, config, batch_size=3),
                        uncached.generate(prompts, config, batch_size=3)):
            assert x.ids == y.ids and x.iterations == y.iterations
            assert x.confidence == pytest.approx(y.confidence, abs=TOL)


def test_block_causal_without_cache_equals_the_loop_reference(hf_model):
    """The uncached block-causal path (batched, padded, one 4D mask) == the reference that
    builds the mask by loops over segments, one unpadded row at a time (float64)."""
    import copy

    model = copy.deepcopy(hf_model).double()
    uncached = hf_generator(model, "off")
    reference = MaskPredictGenerator(BlockCausalReference(model), CharTokenizer(HF_VOCAB))
    prompts = random_prompts(41, 4)
    config = GenerationConfig(length=9, steps=3, block_size=2, blocks="cached")
    for x, y in zip(uncached.generate(prompts, config, batch_size=4), reference.generate(prompts, config)):
        assert x.ids == y.ids
        assert x.confidence == pytest.approx(y.confidence, abs=1e-9)


class _CanvasReference:
    """`slot_logits` of one unpadded full-attention forward of prefix + block + `later` masks:
    LLaDA's canvas, built by hand."""

    def __init__(self, model, later: int):
        self.model, self.later = model, later

    def slot_logits(self, prefix, suffix, j):
        seq = list(prefix) + list(suffix) + [MASK] * self.later
        with torch.no_grad():
            return self.model(input_ids=torch.tensor([seq])).logits[0, len(prefix) + j]


def test_canvas_decoding_equals_a_hand_built_canvas_block_after_block(hf_model):
    """blocks="canvas": each block is Mask-Predict over the whole canvas (later slots present as
    masks, full attention, prompt rows included), block after block; float64 model."""
    import copy

    model = copy.deepcopy(hf_model).double()
    gen = hf_generator(model, "on")  # the canvas never uses the cache, whatever the adapter has
    prompts = random_prompts(5, 3)
    n, block = 8, 3
    outs = gen.generate(prompts, length=n, steps=3, block_size=block, blocks="canvas", batch_size=3)
    for prompt, out in zip(prompts, outs):
        prefix, tokens = [BOS] + CharTokenizer(HF_VOCAB)(prompt)["input_ids"], []
        for start in range(0, n, block):
            width = min(block, n - start)
            reference = _CanvasReference(model, n - start - width)
            tokens += reference_mask_predict(reference, prefix + tokens, width, 3)[0]
        assert out.ids == tokens


def test_canvas_with_one_block_is_mask_predict_under_full_attention(hf_model):
    """With one block there are no later slots: the canvas is the prompt and the slots under full
    attention, i.e. Mask-Predict with split attention turned off."""
    canvas = hf_generator(hf_model, "off")
    full = MaskPredictGenerator(HFMaskedLMAdapter(hf_model, SPECIAL, split_attention="off"), CharTokenizer(HF_VOCAB))
    prompts = random_prompts(23, 4)
    for x, y in zip(canvas.generate(prompts, length=6, steps=3, blocks="canvas"),
                    full.generate(prompts, length=6, steps=3)):
        assert x.ids == y.ids and x.confidence == pytest.approx(y.confidence, abs=TOL)


@pytest.mark.parametrize("blocks", ["cached", "refresh", "canvas"])
@pytest.mark.parametrize("cache", ["on", "off"])
def test_decoding_builds_no_autograd_graph(hf_model, blocks, cache):
    """The model's parameters require grad (as loaded); every forward of a decode runs with
    gradients off, so no iteration's graph is kept alive by the stored confidences."""
    modes = []
    handle = hf_model.register_forward_hook(lambda *_: modes.append(torch.is_grad_enabled()))
    try:
        assert any(p.requires_grad for p in hf_model.parameters())
        out, = hf_generator(hf_model, cache).generate(["abc"], length=6, steps=2, block_size=3, blocks=blocks)
    finally:
        handle.remove()
    assert modes and not any(modes) and len(out.ids) == 6


def test_block_causal_without_cache_needs_the_capability():
    adapter, gen = scripted(prefix_cache=False)  # logits only: no BlockCausalLogits
    with pytest.raises(GenerationConfigError, match="BlockCausalLogits"):
        gen.generate(["ab"], length=4, block_size=2, blocks="cached")


def test_cached_run_encodes_each_prompt_once_and_never_runs_full_forwards(hf_model):
    gen = hf_generator(hf_model, "on")
    calls = {"logits": 0, "encode_prefix": 0, "logits_with_prefix": 0}
    for name in calls:
        original = getattr(gen.adapter, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        setattr(gen.adapter, name, counted)
    out = gen.generate(random_prompts(5, 3), length=6, steps=4, length_beam=3)
    assert calls == {"logits": 0, "encode_prefix": 1, "logits_with_prefix": 4}
    assert all(o.iterations == 4 for o in out)


# ---------------------------------------------------------------------------- randomness

def test_sampling_draws_follow_the_tempered_filtered_distribution():
    from megatron_biglm.generation import sampling

    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert sampling._filter(logits[None], None, 0.8).isfinite().tolist() == [[True, True, False, False]]
    assert sampling._filter(logits[None], 3, None).isfinite().tolist() == [[True, True, True, False]]
    n, temperature = 20000, 2.0
    gen = torch.Generator().manual_seed(0)
    tokens, logconf = sampling.choose(logits.expand(1, n, 4), [n], temperature=temperature,
                                      top_k=3, top_p=None, generators=[gen])
    want = torch.softmax(logits[:3] / temperature, dim=-1)
    freq = torch.bincount(tokens[0], minlength=4).double() / n
    assert freq[3] == 0 and torch.allclose(freq[:3], want.double(), atol=0.015)
    # the confidence is the model's own probability of the drawn token, not the tempered one
    assert torch.allclose(logconf[0].exp(), torch.tensor([0.5, 0.3, 0.15, 0.05])[tokens[0]])


def test_top_k_1_and_tiny_top_p_sample_the_greedy_tokens(hf_model):
    gen = hf_generator(hf_model, "on")
    prompts = random_prompts(13, 3)
    greedy = [o.ids for o in gen.generate(prompts, length=6, steps=3)]
    assert [o.ids for o in gen.generate(prompts, length=6, steps=3, temperature=3.0, top_k=1)] == greedy
    assert [o.ids for o in gen.generate(prompts, length=6, steps=3, temperature=3.0, top_p=1e-6)] == greedy


def test_decoding_is_deterministic_by_seed(hf_model):
    gen = hf_generator(hf_model, "on")
    prompts = random_prompts(11, 4)
    config = GenerationConfig(length=8, steps=4, temperature=1.5, remask="random", seed=1)
    first = [o.ids for o in gen.generate(prompts, config)]
    assert [o.ids for o in gen.generate(prompts, config)] == first
    other = [o.ids for o in gen.generate(prompts, config.replace(seed=2))]
    assert other != first
    greedy = [o.ids for o in gen.generate(prompts, length=8, steps=4)]
    assert greedy != first
    repeated = gen.generate([prompts[0]] * 2, config)  # repeats of a prompt draw differently
    assert repeated[0].ids == first[0] and repeated[1].ids != first[0]


def test_batch_invariant_gives_the_same_ids_alone_or_in_a_batch(hf_model):
    gen = hf_generator(hf_model, "on")
    prompts = random_prompts(21, 5)
    config = GenerationConfig(length=7, steps=3, temperature=1.0, batch_invariant=True, seed=4)
    together = gen.generate(prompts, config, batch_size=5)
    for prompt, out in zip(prompts, together):
        alone, = gen.generate([prompt], config)
        assert alone.ids == out.ids and alone.confidence == out.confidence  # bit for bit


# ---------------------------------------------------------------------------- text

def test_until_truncates_text_and_ids_at_the_first_stop_string():
    adapter, gen = scripted(vocab=30, allow_specials=False)
    full, = gen.generate(["hello"], length=16, steps=4)
    assert len(full.text) == 16  # one character per token
    first, later = full.text[5:7], full.text[9:11]
    out, = gen.generate(["hello"], length=16, steps=4, until=[later, first])
    cut = min(full.text.find(first), full.text.find(later))
    assert out.text == full.text[:cut] and out.finish_reason == "stop"
    assert out.ids == full.ids[:cut] and out.confidence == full.confidence[:cut]
    missing, = gen.generate(["hello"], length=16, steps=4, until=["%"])
    assert missing.text == full.text and missing.finish_reason == "length"


def test_render_canvas_shows_masked_slots():
    tok = CharTokenizer(16)
    assert render_canvas(tok, [5, MASK, MASK, 6, 7], MASK) == "a__bc"


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("options,message", [
    (dict(length=0), "length must be >= 1"),
    (dict(steps=0), "T is the number of Mask-Predict iterations"),
    (dict(length=3, max_new_tokens=3), "not both"),
    (dict(length=3, remask="greedy"), r"remask.*not one of \[.low_confidence., .random., .none.\]"),
    (dict(length=3, top_k=5), "set temperature > 0"),
    (dict(length=3, min_length=4), "lower min_length"),
    (dict(length=3, confidence_threshold=1.5), r"probability in \(0, 1\]"),
    (dict(length=3, until=[""]), "empty string"),
])
def test_bad_options_fail_with_what_to_do(options, message):
    with pytest.raises(GenerationConfigError, match=message):
        GenerationConfig(**options)


def test_unknown_options_are_errors_naming_the_valid_ones():
    with pytest.raises(GenerationConfigError, match=r"\['top_kk'\] \(did you mean 'top_k'\?\).*valid keys in generation: steps, length"):
        GenerationConfig.from_dict({"length": 4, "top_kk": 3})
    adapter, gen = scripted()
    with pytest.raises(GenerationConfigError, match="max_gen_toks"):
        gen.generate(["ab"], max_gen_toks=4)


def test_length_source_errors():
    adapter, gen = scripted()
    with pytest.raises(GenerationConfigError, match="pass length=N"):
        gen.generate(["ab"], length_beam=3, max_new_tokens=4)
    with pytest.raises(GenerationConfigError, match="give length=N"):
        gen.generate(["ab"])


def test_bad_prompts_and_tokenizers():
    adapter, gen = scripted(max_length=12)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        gen.generate(["ab", ""], length=3)
    with pytest.raises(ValueError, match="no mask token"):
        MaskPredictGenerator(adapter, CharTokenizer(16, mask=False))
    no_bos = ScriptedAdapter()
    no_bos.special = SimpleNamespace(bos_id=None, mask_id=MASK, pad_id=None, eos_id=EOS)
    with pytest.raises(ValueError, match="no BOS id"):
        MaskPredictGenerator(no_bos, CharTokenizer(16))
    with pytest.raises(ValueError, match="overflow='truncate_left'"):
        gen.generate(["abcdefgh"], length=6)  # 1 + 8 + 6 > 12
    out, = gen.generate(["abcdefgh"], length=6, overflow="truncate_left")
    assert out.prompt_tokens_dropped == 3
    assert gen.generate(["defgh"], length=6)[0].ids == out.ids  # the last 5 prompt tokens kept
    with pytest.raises(ValueError, match="do not fit"):
        gen.generate(["ab"], length=11, overflow="truncate_left")


def test_generate_ids_equals_generate_on_the_same_tokens(hf_model):
    """Pre-tokenized prompts (a fine-tuning set's sources) decode exactly as their text does,
    including seeded sampling (the seeds hang off the ids, not the text)."""
    gen = hf_generator(hf_model, "on")
    prompts = random_prompts(11, 6)
    ids = [gen.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    for config in (GenerationConfig(length=5, steps=3),
                   GenerationConfig(length=4, steps=2, temperature=1.0, seed=3, length_beam=2)):
        by_text, by_ids = gen.generate(prompts, config, batch_size=4), gen.generate_ids(ids, config, batch_size=4)
        assert [o.ids for o in by_ids] == [o.ids for o in by_text]
        assert [o.text for o in by_ids] == [o.text for o in by_text]
    with pytest.raises(ValueError, match="prompt 1 has no ids"):
        gen.generate_ids([ids[0], []], GenerationConfig(length=2))
