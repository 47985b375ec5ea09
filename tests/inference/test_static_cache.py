"""The slot-pool K/V cache: preallocated per-request slots written in place, exact.

On CPU in fp32, generation with the pool equals generation with the growing cache token for
token (prompts of different lengths, several blocks, a length beam whose candidates share and
then fork a prompt's slot); the growing cache is itself held to the uncached block-causal
forward by tests/inference/test_inference_prefix_cache.py (the megatron adapter has no uncached
block-causal path to decode with). Suffix logits over the pool equal the growing cache's with
rows in order (the buffers read as a view), out of order and repeated (gathered); slots are
taken, given back and copied as requests join, leave and fork.

A block's iterations over the pool (sampling and re-masking included) read nothing back from
the device: counted on CPU with `host_reads.HostReads`, and on CUDA under torch's sync debug
mode set to error (`-m gpu`).
"""
from __future__ import annotations

import gc

import pytest
import torch
from host_reads import HostReads
from model_fixtures import build_model, init_megatron, spread_weights, tiny_config

from benchmarks.bench_generation import IdsTokenizer
from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
from megatron_biglm.generation.mask_predict import live_rows, run_block
from megatron_biglm.generation.slot_forward import SlotForward
from megatron_biglm.inference import TokenIds
from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter, SlotState
from megatron_biglm.model.kv_pool import KVSlotPool, KVSlots

VOCAB = 200
SPECIAL = TokenIds(bos_id=1, mask_id=3, pad_id=0, eos_id=2)


@pytest.fixture(scope="module")
def model():
    init_megatron(1, 1)
    return spread_weights(build_model(tiny_config(vocab_size=VOCAB), seed=4), 0.15)


def _adapter(model, layout: str) -> MegatronMaskedLMAdapter:
    return MegatronMaskedLMAdapter(model, SPECIAL, vocab_size=VOCAB, max_length=128, cache_layout=layout)


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.mark.parametrize("beam", [1, 3], ids=["one_length", "length_beam"])
def test_static_cache_generation_equals_the_growing_cache(model, beam):
    prompts = _prompts(4, seed=beam)
    config = GenerationConfig(length=20, steps=3, block_size=6, blocks="cached", length_beam=beam)
    outputs = {}
    for layout in ("pool", "grow"):
        adapter = _adapter(model, layout)
        gen = MaskPredictGenerator(adapter, IdsTokenizer(), use_cache=True)
        outputs[layout] = [list(o.ids) for o in gen.generate_ids(prompts, config, batch_size=4)]
        assert (adapter._pool is not None) == (layout == "pool")  # the pool really ran
    assert outputs["pool"] == outputs["grow"]
    assert all(len(ids) > 0 for ids in outputs["pool"])


def test_static_cache_suffix_logits_equal_the_growing_cache(model):
    """In order (a view of the buffers), out of order and repeated (gathered), after an extension."""
    pool, grow = _adapter(model, "pool"), _adapter(model, "grow")
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([5, 9, 7])
    ids = torch.randint(4, VOCAB, (3, 9), generator=g)
    states = [a.encode_prefix(ids, lengths) for a in (pool, grow)]
    block = torch.randint(4, VOCAB, (3, 4), generator=g)
    block_lengths = torch.tensor([4, 2, 3])
    rows = torch.tensor([0, 1, 2])
    states = [a.extend_prefix(s, rows, block, block_lengths) for a, s in zip((pool, grow), states)]
    assert isinstance(states[0], SlotState) and states[0].slots == [0, 1, 2]
    suffix = torch.randint(4, VOCAB, (4, 5), generator=g)
    suffix_lengths = torch.tensor([5, 3, 4, 1])
    positions = torch.arange(5)[None].expand(4, -1)
    for order in ([0, 1, 2, 0], [2, 0, 1, 2], [1, 1, 1, 1]):
        rows = torch.tensor(order)
        got, want = (a.logits_with_prefix(s, rows, suffix, suffix_lengths, positions)
                     for a, s in zip((pool, grow), states))
        valid = positions < suffix_lengths[:, None]
        torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)
    in_order = torch.tensor([0, 1, 2])
    got, want = (a.logits_with_prefix(s, in_order, suffix[:3], suffix_lengths[:3], positions[:3])
                 for a, s in zip((pool, grow), states))
    valid = positions[:3] < suffix_lengths[:3, None]
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5)


def test_static_cache_slots_join_leave_fork_and_grow():
    pool = KVSlotPool(num_layers=2, num_slots=2, capacity=8, groups=1, head_dim=2, dtype=torch.float32,
                      device="cpu")
    assert isinstance(pool, KVSlots)
    a = pool.allocate(2)
    assert a == [0, 1]
    pool.keys[0][:3, 0] = 1.0
    pool.lengths[0] = 3
    b = pool.allocate(3)  # runs out: doubles, the old contents kept
    assert b == [2, 3, 4] and pool.num_slots >= 5 and float(pool.keys[0][:3, 0].sum()) == 6.0
    pool.copy_slots([0], [4])
    assert pool.length(4) == 3 and torch.equal(pool.keys[0][:, 4], pool.keys[0][:, 0])
    pool.release([1, 3])
    assert pool.allocate(1) == [1]  # lowest free first
    with pytest.raises(ValueError, match="slot 3 is not in use"):
        pool.release([3])


def test_static_cache_states_give_their_slots_back(model):
    """A dropped state's slots return to the pool; a continued state's slots are handed on and
    a slot two rows continue is copied once."""
    adapter = _adapter(model, "pool")
    ids = torch.randint(4, VOCAB, (2, 4), generator=torch.Generator().manual_seed(1))
    state = adapter.encode_prefix(ids, torch.tensor([4, 3]))
    pool = adapter._pool
    in_use = pool.num_slots - len(pool._free)
    nxt = adapter.extend_prefix(state, torch.tensor([0, 0, 1]), ids[[0, 0, 1], :2], torch.tensor([2, 2, 1]))
    assert nxt.slots[:1] == [0] and nxt.slots[2] == 1 and nxt.slots[1] not in (0, 1)
    assert [pool.length(s) for s in nxt.slots] == [6, 6, 4]
    del state
    gc.collect()
    assert pool.num_slots - len(pool._free) == in_use + 1  # the fork's copy, nothing leaked
    del nxt
    gc.collect()
    assert len(pool._free) == pool.num_slots


# ------------------------------------------------------------------ a block without host reads
BLOCK_CONFIGS = {
    "greedy": GenerationConfig(length=8, steps=5, block_size=8, blocks="cached"),
    "sampled_top_k": GenerationConfig(length=8, steps=5, block_size=8, blocks="cached", temperature=0.9, top_k=20),
    "random_remask": GenerationConfig(length=8, steps=5, block_size=8, blocks="cached", remask="random",
                                      temperature=1.0, top_p=0.9),
    "llada_remask": GenerationConfig(length=8, steps=5, block_size=8, blocks="cached", remask="none"),
}


def _block_forward(model, device="cpu"):
    """A pool forward with three cached prefixes, one extended by a block (slots at different
    lengths), ready to decode the next block."""
    adapter = _adapter(model, "pool")
    forward = SlotForward(adapter, use_cache=True, block_causal=True)
    forward.set_prefixes(_prompts(3, seed=7))
    forward.extend([0, 1, 2], [[5, 6, 7], [8], [9, 10]])
    return forward


def _generators(n, device="cpu"):
    return [torch.Generator(device=device).manual_seed(10 + i) for i in range(n)]


@pytest.mark.parametrize("name", list(BLOCK_CONFIGS))
def test_static_cache_block_reads_nothing_back_from_the_device(model, name):
    """Sampling, re-masking and the pool forwards of a whole block: no `.item()`, `.tolist()`,
    `bool()`, `nonzero` or `.cpu()` of a computed tensor between the block's start and end."""
    config = BLOCK_CONFIGS[name]
    forward = _block_forward(model)
    with torch.no_grad(), HostReads() as reads:
        tokens, _, iterations, _ = run_block(forward, [2, 0, 1], [8, 3, 6], 3, config, SPECIAL.mask_id,
                                             SPECIAL.eos_id, _generators(3))
    assert reads.reads == []
    assert iterations == [5, 4, 5]  # 3 slots over 5 steps: masked_after(3, 5, 4) == 0 ends it early
    assert not bool((tokens[0] == SPECIAL.mask_id).any())


def test_static_cache_block_reads_are_counted_where_a_threshold_needs_them(model):
    """The counter is real: with a confidence threshold the live rows depend on the model's
    confidences and are read once per iteration, and the counter sees those reads."""
    config = BLOCK_CONFIGS["greedy"].replace(confidence_threshold=0.5)
    with torch.no_grad(), HostReads() as reads:
        run_block(_block_forward(model), [0, 1], [8, 8], 0, config, SPECIAL.mask_id, SPECIAL.eos_id, None)
    assert any(name == "tolist" and "mask_predict" in where for name, where in reads.reads)


@pytest.mark.parametrize("name", list(BLOCK_CONFIGS))
def test_static_cache_live_rows_follow_the_schedule(model, name):
    """What the block decides on the host (which rows still run) is what the device computes:
    after every iteration a row holds a masked slot exactly when `live_rows` runs it next."""
    config = BLOCK_CONFIGS[name].replace(return_steps=True)
    g = torch.Generator().manual_seed(len(name))
    for _ in range(4):
        widths = torch.randint(1, 9, (3,), generator=g).tolist()
        steps = int(torch.randint(2, 9, (1,), generator=g))
        cfg = config.replace(steps=steps)
        with torch.no_grad():
            _, _, iterations, canvases = run_block(_block_forward(model), [0, 1, 2], widths, 0, cfg,
                                                   SPECIAL.mask_id, SPECIAL.eos_id, _generators(3))
        for canvas in canvases:
            still = canvas.masked.any(dim=-1).nonzero()[:, 0].tolist()
            assert still == live_rows(widths, steps, canvas.iteration + 1)
        assert iterations == [sum(i in live_rows(widths, steps, t) for t in range(1, steps + 1)) for i in range(3)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: torch's sync debug mode counts device syncs")
def test_gpu_static_cache_block_makes_no_device_sync():
    """On CUDA, a block's iterations over the pool under `torch.cuda.set_sync_debug_mode("error")`:
    any synchronizing call (a read, a blocking copy) raises."""
    init_megatron(1, 1)
    cuda_model = spread_weights(build_model(tiny_config(vocab_size=VOCAB), seed=4), 0.15).cuda()
    for name, config in BLOCK_CONFIGS.items():
        forward = _block_forward(cuda_model)
        gens = _generators(3, "cuda")
        with torch.no_grad():
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
            try:
                tokens, _, _, _ = run_block(forward, [2, 0, 1], [8, 3, 6], 3, config, SPECIAL.mask_id,
                                            SPECIAL.eos_id, gens)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        assert not bool((tokens[0] == SPECIAL.mask_id).any()), name


# ------------------------------------------------------------------ lm-eval's prefix cache
def _questions(n_questions: int, n_choices: int, seed: int):
    from megatron_biglm.evaluation.scoring import ScoreRequest

    g = torch.Generator().manual_seed(seed)
    requests = []
    for prompt in _prompts(n_questions, seed):
        for _ in range(n_choices):
            n = int(torch.randint(1, 5, (1,), generator=g))
            requests.append(ScoreRequest((SPECIAL.bos_id, *prompt), tuple(torch.randint(4, VOCAB, (n,), generator=g).tolist())))
    return requests


@pytest.mark.parametrize("rule", ["beam", "pll"])
@pytest.mark.parametrize("questions", [1, 3], ids=["one_prompt_broadcast", "three_prompts_gathered"])
def test_static_cache_serves_eval_scores_equal_to_uncached(model, rule, questions):
    """lm-eval's prefix cache over the pool: a prompt is encoded once into a slot and all its
    continuations are scored in one batch against it (read once and broadcast when the batch
    holds one prompt, gathered otherwise); every score equals the uncached forward's (fp32)."""
    from megatron_biglm.evaluation.runner import score_requests
    from megatron_biglm.evaluation.scoring import make_rule

    adapter = _adapter(model, "pool")
    requests = _questions(questions, 4, seed=questions)
    scored = {reuse: score_requests(adapter, requests, make_rule(rule, SPECIAL.mask_id), batch_size=16,
                                    prefix_reuse=reuse) for reuse in (True, False)}
    assert adapter._pool is not None and len(adapter._pool._free) == adapter._pool.num_slots  # used, given back
    for cached, plain in zip(scored[True], scored[False]):
        assert abs(cached.logprob - plain.logprob) <= 1e-5
        assert cached.is_greedy == plain.is_greedy


def test_static_cache_layout_is_asked_for_megatron_checkpoints_only(tmp_path):
    from megatron_biglm.inference.loading import load_adapter

    with pytest.raises(ValueError, match="cache_layout='pool' is for megatron checkpoints"):
        load_adapter(tmp_path, device="cpu", cache_layout="pool")



def test_static_cache_layout_must_be_known(model):
    with pytest.raises(ValueError, match="cache_layout must be one of"):
        _adapter(model, "paged")


# ------------------------------------------------------------------ the step a CUDA graph captures
def test_static_cache_fixed_shape_step_equals_the_pool_step(model):
    """The fixed-shape step (slot lengths as a device input, attention over each slot's whole
    capacity) that a CUDA graph captures gives the pool step's logits and writes the same keys."""
    from megatron_biglm.model.kv_pool import FixedShapePoolForward, PoolForward, on_device

    adapter = _adapter(model, "pool")
    g = torch.Generator().manual_seed(11)
    state = adapter.encode_prefix(torch.randint(4, VOCAB, (3, 9), generator=g), torch.tensor([9, 4, 6]))
    state = adapter.extend_prefix(state, torch.tensor([0, 1, 2]), torch.randint(4, VOCAB, (3, 5), generator=g),
                                  torch.tensor([5, 2, 3]))
    pool, slots = state.pool, state.slots
    assert slots == [0, 1, 2] and [pool.length(s) for s in slots] == [14, 6, 9]
    ids = torch.randint(4, VOCAB, (3, 6), generator=g)
    lengths, positions = torch.tensor([6, 4, 5]), torch.tensor([[0, 2, 5], [1, 3, 0], [4, 0, 2]])
    want = adapter._pool_step(ids, lengths, positions, PoolForward(pool, slots))
    written = [k[:, :3].clone() for k in pool.keys]
    for keys in (None, 32):  # the whole capacity, or a bound past the longest slot (14 + 6)
        fixed = FixedShapePoolForward(pool, 0, 3, on_device([pool.length(s) for s in slots], "cpu"), keys)
        got = adapter._pool_step(ids, lengths, positions, fixed)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for before, now in zip(written, pool.keys):
            torch.testing.assert_close(now[:, :3], before, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="never committed"):
        fixed.commit()


def test_static_cache_step_graphs_need_the_pool(model):
    with pytest.raises(ValueError, match="set cache_layout='pool'"):
        MegatronMaskedLMAdapter(model, SPECIAL, vocab_size=VOCAB, max_length=128, step_graphs=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs")
def test_gpu_static_cache_step_graphs_decode_the_eager_tokens():
    """Generation whose cached steps replay CUDA graphs (one per batch and block shape) gives
    the eager pool's tokens, fp32."""
    init_megatron(1, 1)
    cuda_model = spread_weights(build_model(tiny_config(vocab_size=VOCAB), seed=4), 0.15).cuda()
    prompts = [p[:6] + [5] * (6 - len(p[:6])) for p in _prompts(4, seed=5)]  # equal lengths: consecutive slots
    config = GenerationConfig(length=24, steps=4, block_size=8, blocks="cached")
    outputs = {}
    for graphs in (False, True):
        adapter = MegatronMaskedLMAdapter(cuda_model, SPECIAL, vocab_size=VOCAB, max_length=128,
                                          cache_layout="pool", step_graphs=graphs)
        gen = MaskPredictGenerator(adapter, IdsTokenizer(), use_cache=True)
        outputs[graphs] = [list(o.ids) for o in gen.generate_ids(prompts, config, batch_size=4)]
        if graphs:
            assert adapter._graphs._steps, "no step was captured"
    assert outputs[True] == outputs[False]
