"""Serving with compiled layers compiles once: the server's scheduler and slot-pool decoder (what
`biglm-serve` builds for a megatron checkpoint) decode requests of fresh prompt lengths that join
a running batch between blocks, so each block step sees a new mix of rows, prefix widths and
slots; after a warm-up of the same kinds of step, none of it compiles again or breaks a graph.
Every served answer is still the generator's own answer for that prompt."""
from __future__ import annotations

import threading

import pytest
from compile_watch import compiled_megatron_generator, describe, fresh_dynamo  # noqa: F401
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.common.compile_counts import compile_counts
from megatron_biglm.generation import GenerationConfig
from megatron_biglm.generation.blocks import Candidate
from megatron_biglm.serving.scheduler import BlockScheduler, GenerationJob
from megatron_biglm.serving.slot_decoder import SlotPoolBlockDecoder

CONFIG = GenerationConfig(max_new_tokens=12, steps=2, block_size=4, blocks="cached", temperature=0.9, seed=5)


class Served:
    """Requests submitted to a scheduler, each joining when a chosen earlier one has decoded a
    chosen number of blocks (or at once)."""

    def __init__(self, generator, scheduler):
        self.generator, self.scheduler = generator, scheduler
        self.jobs: list[GenerationJob] = []
        self.errors: list = []
        self.done: list[threading.Event] = []

    def submit(self, prompt: str, *, then: "tuple[str, int] | None" = None) -> None:
        """Submit `prompt`; `then=(next_prompt, k)` submits next_prompt once this one has decoded
        k blocks, so it joins the running batch."""
        gen = self.generator
        ids = gen.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        n = CONFIG.max_new_tokens
        cand = Candidate([gen.adapter.special.bos_id] + ids, n, gen.candidate_generator(CONFIG.seed, ids, 0, n))
        done = threading.Event()

        def on_done(job, error):
            self.errors.append(error)
            done.set()

        def on_block(job):
            if then is not None and job.blocks_done == then[1]:
                self.submit(then[0])

        self.jobs.append(GenerationJob(CONFIG, [[cand]], CONFIG.block_size, 1e18, on_done, on_block=on_block))
        self.done.append(done)
        self.scheduler.submit(self.jobs[-1])

    def wait(self) -> None:
        for event in self.done:
            assert event.wait(300), "a served request did not finish in 300 s"


@pytest.mark.slow
def test_compiled_served_batches_do_not_recompile(gen_checkpoint, fresh_dynamo):  # noqa: F811
    generator = compiled_megatron_generator(gen_checkpoint, cache_layout="pool")
    steps: list[int] = []

    class Rows:
        def block_step(self, rows, tokens, seconds):  # noqa: ARG002 - the scheduler's stats signature
            steps.append(rows)

    scheduler = BlockScheduler(SlotPoolBlockDecoder(generator.adapter, 8), max_queue=16, max_rows=8, stats=Rows())
    try:
        start = compile_counts()
        # warm-up: one request alone, then two at once with one joining later (rows 1, 2, 3)
        warm_up = Served(generator, scheduler)
        warm_up.submit("To be, or not to be")
        warm_up.wait()
        warm_up.submit("O Romeo, Romeo", then=("Now is the winter of our discontent", 1))
        warm_up.submit("A horse")
        warm_up.wait()
        warm = compile_counts()
        assert warm.since(start).breaks == 0, describe(warm.since(start))
        # served: fresh prompt lengths, a batch that grows block by block and shrinks as requests end
        served = Served(generator, scheduler)
        served.submit("Friends, Romans, countrymen, lend me your ears",
                      then=("All the world's a stage, and all the men and women merely players", 1))
        served.submit("Is this a dagger", then=("Out, damned spot", 2))
        served.submit("Good night, good night")
        served.wait()
        after = compile_counts().since(warm)
    finally:
        scheduler.close()
    errors = [error for error in warm_up.errors + served.errors if error is not None]
    assert not errors, errors
    assert max(steps) >= 4, steps  # requests did share block steps
    assert after.compiles == 0 and after.recompiles == 0 and after.breaks == 0, describe(after)
    prompts = ["Friends, Romans, countrymen, lend me your ears", "Is this a dagger", "Good night, good night"]
    want = generator.generate(prompts, CONFIG, batch_size=1)
    got = {tuple(job.groups[0][0].prefix): job for job in served.jobs}
    for prompt, out in zip(prompts, want):
        ids = generator.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        job = got[tuple([generator.adapter.special.bos_id] + ids)]
        assert generator.output_of(prompt, job.groups[0], 0, CONFIG).ids == out.ids, prompt
