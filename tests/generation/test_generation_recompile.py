"""Long-form generation with compiled layers compiles once: block-wise decoding over the slot
pool (its K/V writes planned before the layers run) at fresh prompt lengths and block offsets
makes no compile after a warm-up generation, and no graph break."""
from __future__ import annotations

import pytest
from compile_watch import fresh_dynamo, compiled_megatron_generator, describe
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.common.compile_counts import compile_counts

SETTINGS = dict(max_new_tokens=24, steps=2, block_size=8, blocks="cached")


@pytest.mark.slow
def test_compiled_long_form_generation_does_not_recompile(gen_checkpoint, fresh_dynamo):  # noqa: F811
    gen = compiled_megatron_generator(gen_checkpoint)
    start = compile_counts()
    gen.generate(["To be, or not to be", "O Romeo"], batch_size=2, **SETTINGS)  # warm-up
    gen.generate(["Now is the winter"], batch_size=1, **SETTINGS)
    warm = compile_counts()
    assert warm.since(start).breaks == 0, describe(warm.since(start))
    out = gen.generate(["Friends, Romans, countrymen, lend me your ears", "A horse"], batch_size=2, **SETTINGS)
    out += gen.generate(["All the world's a stage, and all"], batch_size=1, **SETTINGS)
    after = compile_counts().since(warm)
    assert len(out) == 3 and all(o.ids for o in out)
    assert after.compiles == 0 and after.recompiles == 0 and after.breaks == 0, describe(after)
