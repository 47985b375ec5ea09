"""Prompt ids the model cannot embed are refused before any forward (`generation.prompt_ids`).

What must hold: over random ranges and id lists, an id is refused exactly when it lies outside
`[0, min(embedding rows, tokenizer ids))`, and the message names the first such id, its
position and that range; through the generator, with a real model behind the HF adapter, ids
given (`generate_ids`) and ids a text tokenizes to (`generate`) past the model's embedding rows
raise before the model runs once, while the ids below them decode.
"""
from __future__ import annotations

import pytest
from eval_fixtures import tiny_biglm
from generation_fakes import SPECIAL, CharTokenizer
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
from megatron_biglm.generation.prompt_ids import BadTokenId, PromptIdRange
from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter

ROWS = 40


@settings(max_examples=200, deadline=None)
@given(rows=st.none() | st.integers(1, 50), tokenizer_ids=st.none() | st.integers(1, 50),
       ids=st.lists(st.integers(-5, 60), max_size=12), index=st.integers(0, 3))
def test_an_id_is_refused_exactly_when_outside_the_smaller_range(rows, tokenizer_ids, ids, index):
    known = [n for n in (rows, tokenizer_ids) if n is not None]
    limit = min(known) if known else None
    bad = [(p, t) for p, t in enumerate(ids) if t < 0 or (limit is not None and t >= limit)]
    check = PromptIdRange(rows, tokenizer_ids)
    assert check.limit == limit
    if not bad:
        check.check(index, ids)
        return
    with pytest.raises(BadTokenId) as refused:
        check.check(index, ids)
    position, token = bad[0]
    message = str(refused.value)
    assert f"prompt {index} holds token id {token} at position {position}, " in message
    assert f"[0, {limit})" in message
    assert ("never negative" in message) == (token < 0)
    unembedded = rows is not None and tokenizer_ids is not None and rows <= token < tokenizer_ids
    assert ("without resizing the model" in message) == unembedded


def test_the_generator_refuses_ids_past_the_embedding_before_any_forward():
    model = tiny_biglm(ROWS, SPECIAL, seed=3)
    forwards = []
    model.get_input_embeddings().register_forward_hook(lambda *_: forwards.append(1))  # every forward
    # the tokenizer knows more characters than the model has rows: ids 40.. have none
    generator = MaskPredictGenerator(HFMaskedLMAdapter(model, SPECIAL), CharTokenizer(ROWS + 10))
    assert generator.prompt_ids.embedding_rows == ROWS
    forwards.clear()  # the adapter's probes ran at load time
    config = GenerationConfig(length=3, steps=2)
    with pytest.raises(BadTokenId, match=rf"prompt 1 holds token id {ROWS} at position 2, outside "
                                          rf"this model's token ids \[0, {ROWS}\)"):
        generator.generate_ids([[5, 6], [5, 6, ROWS]], config)
    with pytest.raises(BadTokenId, match="token ids are never negative"):
        generator.generate_ids([[-1]], config)
    past = generator.tokenizer.alphabet[ROWS - 5]  # the first character whose id has no row
    with pytest.raises(BadTokenId, match=rf"prompt 0 tokenizes to id {ROWS} \('{past}'\) at position 1"):
        generator.generate([f"a{past}"], config)
    assert forwards == []
    assert len(generator.generate(["abc"], config)[0].ids) == 3 and forwards


def test_the_range_is_the_tokenizers_when_it_is_the_smaller():
    class SizedTokenizer(CharTokenizer):
        def __len__(self):
            return 30

    generator = MaskPredictGenerator(HFMaskedLMAdapter(tiny_biglm(ROWS, SPECIAL, seed=3), SPECIAL),
                                     SizedTokenizer(30))
    assert (generator.prompt_ids.limit, generator.prompt_ids.unembedded) == (30, 0)
    assert generator.prompt_ids.warning() is None
    with pytest.raises(BadTokenId, match=r"token id 30 at position 0, outside this model's token ids \[0, 30\);"):
        generator.generate_ids([[30]], GenerationConfig(length=2))
