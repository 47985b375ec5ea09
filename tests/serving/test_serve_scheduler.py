"""The serving scheduler in-process, over the real block decoder and a real model (the HF export
of the generation tests): requests join a running batch between blocks and still get the
generator's answer, a model failure answers its own request and the next one is served, and
the HTTP layer turns each refusal into its status and OpenAI-style body."""
from __future__ import annotations

import json
import threading

import pytest
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
from megatron_biglm.generation.blocks import Candidate
from megatron_biglm.serving.app import error_response
from megatron_biglm.serving.block_decoder import ExactCacheBlockDecoder
from megatron_biglm.serving.scheduler import (BlockScheduler, GenerationJob, QueueFull, RequestTimeout,
                                              ShuttingDown)
from megatron_biglm.serving.schema import BadRequest


class Steps:
    """The scheduler's stats: rows of every block step, in order."""

    def __init__(self):
        self.rows: list[int] = []

    def block_step(self, rows, tokens, seconds):
        self.rows.append(rows)


@pytest.fixture(scope="module")
def generator(gen_export):  # noqa: F811
    return MaskPredictGenerator.from_pretrained(gen_export)


def _job(generator, prompt: str, config: GenerationConfig, seed_choice: int = 0, **kw):
    ids = generator.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    n = config.max_new_tokens
    cand = Candidate([generator.adapter.special.bos_id] + ids, n,
                     generator.candidate_generator(config.seed, ids, seed_choice, n))
    done = threading.Event()
    result = {}

    def on_done(job, error):
        result["error"] = error
        done.set()

    job = GenerationJob(config, [[cand]], config.block_size or n, kw.pop("deadline", 1e18), on_done, **kw)
    return job, done, result


def test_a_request_joins_between_blocks_and_gets_the_generators_answer(generator):
    config = GenerationConfig(max_new_tokens=12, steps=3, block_size=2, temperature=0.9, seed=3)
    steps = Steps()
    scheduler = BlockScheduler(ExactCacheBlockDecoder(generator.adapter), max_queue=4, max_rows=8, stats=steps)
    second = {}

    def after_first_block(job):
        if job.blocks_done == 1 and not second:  # B arrives while A is between its blocks
            second["job"] = _job(generator, "O Romeo, Romeo", config)
            scheduler.submit(second["job"][0])

    first, first_done, first_result = _job(generator, "To be, or not to be", config, on_block=after_first_block)
    scheduler.submit(first)
    assert first_done.wait(120)
    job_b, b_done, b_result = second["job"]
    assert b_done.wait(120)
    scheduler.close()
    assert first_result["error"] is None and b_result["error"] is None
    assert 2 in steps.rows  # some block steps decoded both
    assert steps.rows[0] == 1  # A ran alone until B joined
    want = generator.generate(["To be, or not to be", "O Romeo, Romeo"], config, batch_size=1)
    for job, out in zip((first, job_b), want):
        got = generator.output_of("", job.groups[0], 0, config)
        assert got.ids == out.ids


def test_a_model_failure_answers_its_request_and_the_next_one_is_served(generator):
    config = GenerationConfig(max_new_tokens=4, steps=2)
    scheduler = BlockScheduler(ExactCacheBlockDecoder(generator.adapter), max_queue=4, max_rows=8)
    bad, bad_done, bad_result = _job(generator, "To be", config)
    bad.groups[0][0].prefix.append(10 ** 7)  # an id no embedding row has: the model itself fails
    scheduler.submit(bad)
    assert bad_done.wait(120)
    good, good_done, good_result = _job(generator, "To be", config)
    scheduler.submit(good)
    assert good_done.wait(120)
    scheduler.close()
    assert isinstance(bad_result["error"], (IndexError, RuntimeError))
    assert good_result["error"] is None
    want = generator.generate(["To be"], config)[0]
    assert generator.output_of("", good.groups[0], 0, config).ids == want.ids
    response = error_response(bad_result["error"])
    body = json.loads(response.body)
    assert response.status_code == 500 and body["error"]["type"] == "server_error"
    assert "the model failed" in body["error"]["message"]


def test_queue_limit_timeout_and_shutdown(generator):
    config = GenerationConfig(max_new_tokens=40, steps=20, block_size=2)
    scheduler = BlockScheduler(ExactCacheBlockDecoder(generator.adapter), max_queue=1, max_rows=1)
    running, running_done, running_result = _job(generator, "To be", config, deadline=0.0)  # already late
    scheduler.submit(running)
    waiting = [_job(generator, "Now is the winter", config) for _ in range(3)]
    accepted, refused = 0, 0
    for job, _, _ in waiting:
        try:
            scheduler.submit(job)
            accepted += 1
        except QueueFull as exc:
            refused += 1
            assert "queue holds 1" in str(exc)
    assert running_done.wait(120)
    assert isinstance(running_result["error"], RequestTimeout)
    assert refused >= 1 and accepted + refused == 3
    scheduler.close()  # finishes what it holds
    for job, done, result in waiting[:accepted]:
        assert done.is_set() and result["error"] is None
    with pytest.raises(ShuttingDown):
        scheduler.submit(_job(generator, "To be", config)[0])
    for exc, status in ((QueueFull("full"), 429), (ShuttingDown(), 503), (RequestTimeout("late"), 504),
                        (BadRequest("no", "n"), 400)):
        assert error_response(exc).status_code == status
    assert error_response(QueueFull("full")).headers["Retry-After"] == "1"


# ---------------------------------------------------------------- the slot pool (megatron checkpoint)

@pytest.fixture(scope="module")
def pool_generator(gen_checkpoint):  # noqa: F811
    return MaskPredictGenerator.from_pretrained(gen_checkpoint, cache_layout="pool")


@pytest.mark.parametrize("blocks", ["refresh", "cached"])
def test_pool_slots_hold_each_request_across_blocks_and_are_freed(pool_generator, blocks):
    """Requests of different lengths join a running batch between blocks; every answer equals
    the generator's for that request alone (same blocks mode), and every slot goes back."""
    from megatron_biglm.serving.slot_decoder import SlotPoolBlockDecoder

    gen = pool_generator
    configs = [GenerationConfig(max_new_tokens=n, steps=2, block_size=3, temperature=t, seed=s, blocks=blocks)
               for n, t, s in ((10, 0.9, 1), (7, 0.0, 0), (12, 1.0, 2))]
    prompts = ["To be, or not to be", "O Romeo, Romeo", "Now is the winter of our discontent"]
    decoder = SlotPoolBlockDecoder(gen.adapter, rows=4)
    free_before = len(decoder.pool._free)
    steps = Steps()
    scheduler = BlockScheduler(decoder, max_queue=8, max_rows=4, stats=steps)
    jobs = []

    def join_later(job):
        if job.blocks_done == 1 and len(jobs) == 1:  # the others arrive between A's blocks
            for prompt, config in zip(prompts[1:], configs[1:]):
                jobs.append(_job(gen, prompt, config))
                scheduler.submit(jobs[-1][0])

    jobs.append(_job(gen, prompts[0], configs[0], on_block=join_later))
    scheduler.submit(jobs[0][0])
    for job, done, result in list(jobs):
        assert done.wait(120) and result["error"] is None
    for job, done, result in jobs[1:]:
        assert done.wait(120) and result["error"] is None
    scheduler.close()
    assert max(steps.rows) >= 2  # some block steps decoded several requests
    for (job, _, _), prompt, config in zip(jobs, prompts, configs):
        want = gen.generate([prompt], config)[0]
        assert gen.output_of("", job.groups[0], 0, config).ids == want.ids
    assert decoder.slots_held == 0 and len(decoder.pool._free) == free_before
    assert decoder.pool.num_slots == 8  # bounded: never grew past its preallocation


def test_a_cancelled_request_gives_its_slot_back(pool_generator):
    from megatron_biglm.serving.scheduler import Cancelled
    from megatron_biglm.serving.slot_decoder import SlotPoolBlockDecoder

    decoder = SlotPoolBlockDecoder(pool_generator.adapter, rows=2)
    scheduler = BlockScheduler(decoder, max_queue=4, max_rows=2)
    config = GenerationConfig(max_new_tokens=30, steps=2, block_size=2, blocks="cached")
    held = []

    def leave(job):
        held.append(decoder.slots_held)
        job.cancel()  # the client went away after the first block

    job, done, result = _job(pool_generator, "To be, or not to be", config, on_block=leave)
    scheduler.submit(job)
    assert done.wait(120)
    scheduler.close()
    assert isinstance(result["error"], Cancelled)
    assert held == [1] and decoder.slots_held == 0

