"""The registered lm-eval models `hf-mlm` and `biglm` on tiny local models and tokenizers."""
from __future__ import annotations

import math

import pytest
import torch
from eval_fixtures import (bert_dir, bf_beam, bf_greedy_reveal, bf_l2r, bf_oneshot,  # noqa: F401
                           biglm_dir, bpe_dir, instances, one_torch_thread, tiny_bert,
                           wordpiece_dir)

import megatron_biglm.evaluation  # noqa: F401 - registers the models
from megatron_biglm.evaluation.models import BiGLMEvalLM, HFMaskedLMEvalLM

PAIRS = [
    ("Question: Which organ pumps blood?\nAnswer:", " the heart"),
    ("Question: Which organ pumps blood?\nAnswer:", " the lung of a whale"),
    ("Question: Which organ pumps blood?\nAnswer:", " a stone"),
    ("To be, or not to be, that is", " the question"),
    ("Friends, Romans, countrymen, lend me your", " ears"),
]


def token_pair(lm, context, continuation):
    """Independent tokenization of a pair: whole string, split at the context's length."""
    tok = lm.tokenizer
    ctx = tok(context, add_special_tokens=False)["input_ids"]
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    return (lm.adapter.special.bos_id, *ctx), tuple(whole[len(ctx):])


@pytest.mark.parametrize("kind", ["hf-mlm", "biglm"])
def test_loglikelihood_equals_brute_force_for_saved_models(kind, bert_dir, biglm_dir):
    cls, path = (HFMaskedLMEvalLM, bert_dir) if kind == "hf-mlm" else (BiGLMEvalLM, biglm_dir)
    for scoring, reference in (("beam", bf_greedy_reveal), ("l2r", bf_l2r), ("oneshot", bf_oneshot)):
        lm = cls(path=str(path), dtype="float64", scoring=scoring, batch_size=2, progress=False)
        assert lm.adapter.split_mode == "4d-mask" and lm.prefix_reuse
        got = lm.loglikelihood(instances(PAIRS))
        for (context, continuation), (logprob, greedy) in zip(PAIRS, got):
            prefix, cont = token_pair(lm, context, continuation)
            want = reference(lm.adapter.model, prefix, cont, lm.adapter.special.mask_id)
            want = want[0] if isinstance(want, tuple) else want
            assert logprob == pytest.approx(want, abs=1e-5), (scoring, context, continuation)
            assert isinstance(greedy, bool)


def test_beam_width_and_model_info_are_reported(biglm_dir):
    lm = BiGLMEvalLM(path=str(biglm_dir), dtype="float64", scoring="beam", beam=2,
                     progress=False)
    (logprob, _), = lm.loglikelihood(instances(PAIRS[:1]))
    prefix, cont = token_pair(lm, *PAIRS[0])
    assert logprob == pytest.approx(bf_beam(lm.adapter.model, prefix, cont,
                                            lm.adapter.special.mask_id, 2), abs=1e-5)
    info = lm.get_model_info()["masked_lm_eval"]
    assert info["scoring"] == "beam" and info["beam"] == 2 and info["prefix_reuse"] is True
    assert info["split_mode"] == "4d-mask" and info["scored_requests"] == 1
    assert info["forward_passes"] >= len(cont)


def test_trailing_context_space_moves_to_the_continuation(biglm_dir):
    lm = BiGLMEvalLM(path=str(biglm_dir), dtype="float64", scoring="oneshot", progress=False)
    a, b = lm.loglikelihood(instances([("The answer is ", "yes"), ("The answer is", " yes")]))
    assert a[0] == pytest.approx(b[0], abs=1e-12)


def test_long_contexts_are_cut_from_the_left_and_counted(biglm_dir):
    lm = BiGLMEvalLM(path=str(biglm_dir), dtype="float64", scoring="oneshot", max_length=16,
                     progress=False)
    context = "Now is the winter of our discontent made glorious summer by this sun of York"
    (logprob, _), = lm.loglikelihood(instances([(context, " and all the clouds")]))
    prefix, cont = token_pair(lm, context, " and all the clouds")
    kept = prefix[1:][len(prefix) - 1 - (16 - 1 - len(cont)):]
    want, _ = bf_oneshot(lm.adapter.model, (prefix[0], *kept), cont, lm.adapter.special.mask_id)
    assert len(kept) + 1 + len(cont) == 16
    assert logprob == pytest.approx(want, abs=1e-5)
    assert lm.get_model_info()["masked_lm_eval"]["truncated_contexts"] == 1


def test_rolling_loglikelihood_predicts_each_token_once(biglm_dir):
    text = "Shall I compare thee to a summer's day? Thou art more lovely and more temperate."
    long_lm = BiGLMEvalLM(path=str(biglm_dir), dtype="float64", scoring="l2r", progress=False)
    n_tokens = len(long_lm.tok_encode(text))
    (rolled,) = long_lm.loglikelihood_rolling(instances([(text,)], "loglikelihood_rolling"))
    (whole, _), = long_lm.loglikelihood(instances([("", text)]))
    assert rolled == pytest.approx(whole, abs=1e-9)  # one window: [BOS] + all tokens

    short = BiGLMEvalLM(path=str(biglm_dir), dtype="float64", scoring="l2r", max_length=8,
                        progress=False)
    (windowed,) = short.loglikelihood_rolling(instances([(text,)], "loglikelihood_rolling"))
    info = short.get_model_info()["masked_lm_eval"]
    assert info["forward_passes"] == n_tokens  # l2r: one pass per predicted token
    assert info["scored_requests"] == math.ceil(n_tokens / 6)  # windows of 8 - BOS - 1 context
    assert info["truncated_contexts"] == 0
    assert windowed < 0 and windowed != pytest.approx(rolled, abs=1e-6)


def test_generate_until_runs_and_refuses_unknown_kwargs(bert_dir):
    from megatron_biglm.generation import GenerationConfigError

    lm = HFMaskedLMEvalLM(pretrained=str(bert_dir), progress=False)
    (text,) = lm.generate_until(instances([("Hello", {"until": ["\n"], "max_gen_toks": 3,
                                                       "steps": 2})], "generate_until"))
    assert isinstance(text, str) and "\n" not in text
    with pytest.raises(GenerationConfigError, match="num_beams"):
        lm.generate_until(instances([("Hello", {"max_gen_toks": 3, "num_beams": 2})],
                                    "generate_until"))


class _IgnoresMasks(torch.nn.Module):
    """A masked LM that runs full attention whatever mask it is given."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.config = inner, inner.config

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        return self.inner(input_ids=input_ids, **kwargs)


def test_models_that_ignore_split_masks_run_full_attention_or_are_refused(wordpiece_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(wordpiece_dir))
    model = _IgnoresMasks(tiny_bert(len(tok), seed=2))
    lm = HFMaskedLMEvalLM(pretrained=model, tokenizer=tok, progress=False)
    info = lm.get_model_info()["masked_lm_eval"]
    assert (info["split_mode"], info["prefix_cache"], info["prefix_reuse"]) == ("none", False, False)
    assert "full attention" in info["split_note"]
    with pytest.raises(ValueError, match="cannot apply a split attention mask"):
        BiGLMEvalLM(pretrained=model, tokenizer=tok)
    with pytest.raises(ValueError, match="prefix_reuse=on"):
        HFMaskedLMEvalLM(pretrained=model, tokenizer=tok, prefix_reuse=True)


def test_registered_in_lm_eval_without_hiding_builtin_models():
    from lm_eval.api.registry import get_model, model_registry

    assert get_model("hf-mlm") is HFMaskedLMEvalLM
    assert get_model("biglm") is BiGLMEvalLM
    # lm-eval fills its built-in names only into an empty registry: they must still be there
    assert {"hf", "vllm", "dummy"} <= set(model_registry.keys())


def test_bad_model_arguments_are_named(bert_dir):
    with pytest.raises(TypeError, match="unknown model argument"):
        HFMaskedLMEvalLM(pretrained=str(bert_dir), scorin="beam")
    with pytest.raises(ValueError, match="choose one of"):
        HFMaskedLMEvalLM(pretrained=str(bert_dir), scoring="causal")
    with pytest.raises(ValueError, match="auto, on or off"):
        HFMaskedLMEvalLM(pretrained=str(bert_dir), prefix_reuse="sometimes")
