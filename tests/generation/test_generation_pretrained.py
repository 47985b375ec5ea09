"""`MaskPredictGenerator.from_pretrained`: an HF export and the megatron checkpoint it came from
decode to the same ids with the same settings, both through their exact
prefix caches."""
from __future__ import annotations

import pytest
import torch
from eval_fixtures import one_torch_thread  # noqa: F401
from generation_model_fixtures import gen_checkpoint, gen_export, gen_tokenizer_dir  # noqa: F401

from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator

PROMPTS = ["To be, or not to be", "O Romeo, Romeo", "Now is the winter of our discontent made"]
SETTINGS = [dict(length=8, steps=4),
            dict(length=9, steps=3, block_size=4, blocks="cached"),
            dict(max_new_tokens=6, steps=3, temperature=0.8, top_k=20, seed=3)]


@pytest.fixture(scope="module")
def generators(gen_checkpoint, gen_export):
    mega = MaskPredictGenerator.from_pretrained(gen_checkpoint)
    hf = MaskPredictGenerator.from_pretrained(gen_export)
    return mega, hf


def test_both_backends_load_with_their_prefix_cache_in_fp32_on_cpu(generators):
    mega, hf = generators
    assert type(mega.adapter).__name__ == "MegatronMaskedLMAdapter"
    assert type(hf.adapter).__name__ == "HFMaskedLMAdapter"
    assert mega.use_cache and hf.use_cache and hf.adapter.split_mode == "4d-mask"
    assert next(mega.adapter.model.parameters()).dtype == torch.float32
    assert next(hf.adapter.model.parameters()).dtype == torch.float32


@pytest.mark.parametrize("settings", SETTINGS, ids=["plain", "blocks-cached", "sampled"])
def test_export_and_checkpoint_give_the_same_ids(generators, settings):
    mega, hf = generators
    config = GenerationConfig(**settings)
    got = mega.generate(PROMPTS, config, batch_size=2)
    want = hf.generate(PROMPTS, config, batch_size=3)
    assert [o.ids for o in got] == [o.ids for o in want]
    assert [o.text for o in got] == [o.text for o in want]
    for a, b in zip(got, want):
        assert a.confidence == pytest.approx(b.confidence, abs=1e-4)
        assert a.iterations == b.iterations


def test_unknown_path_and_unknown_option_are_clear(tmp_path, gen_export):
    with pytest.raises(FileNotFoundError, match="neither an exported HF directory"):
        MaskPredictGenerator.from_pretrained(tmp_path)
    with pytest.raises(TypeError, match="colour"):
        MaskPredictGenerator.from_pretrained(gen_export, colour="red")


@pytest.mark.parametrize("settings", SETTINGS[:2], ids=["plain", "blocks-cached"])
def test_bucketed_lengths_give_the_same_ids_on_both_backends(generators, gen_checkpoint, gen_export,
                                                             settings):
    config = GenerationConfig(**settings)
    for plain, path in zip(generators, (gen_checkpoint, gen_export)):
        bucketed = MaskPredictGenerator.from_pretrained(path, length_buckets="pow2")
        assert bucketed.adapter.length_buckets is not None
        got = bucketed.generate(PROMPTS, config, batch_size=2)
        want = plain.generate(PROMPTS, config, batch_size=2)
        assert [o.ids for o in got] == [o.ids for o in want]
        for a, b in zip(got, want):
            assert a.confidence == pytest.approx(b.confidence, abs=1e-5)


def test_quickstart_generate_stage(gen_export):
    from megatron_biglm.cli.quickstart import stage_generate

    out = stage_generate(str(gen_export), length=5, steps=2)
    assert list(out["continuations"]) == ["To be, or not to be, that is", "My lord, the king"]
    assert all(isinstance(t, str) and t for t in out["continuations"].values())
