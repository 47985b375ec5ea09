"""Prompted classification features: positions, split, truncation, and the label score
rule (sum of the label tokens' log-probs at the mask slots) on hand-made logits."""
import math

import pytest
import torch

from finetune_fixtures import ids_of, word_tokenizer
from megatron_biglm.finetune.row_report import SOURCE_TOO_LONG, RowReport
from megatron_biglm.finetune.kinds.verbalizer import (IGNORE_INDEX, VerbalizerEncoder, VerbalizerPrompt, collate,
                                                      label_scores, predict_labels, verbalizer_loss)
from megatron_biglm.finetune.tasks import PROMPTS, TASKS

PROMPT = VerbalizerPrompt("{premise} Question: {hypothesis} True, False or not sure? Answer: <mask>.",
                          ("True", "not sure", "False"))
ROW = {"premise": "the cat sat", "hypothesis": "a dog ran"}
LONG = {"premise": "the cat sat on the mat all day long", "hypothesis": "a dog ran"}


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer([PROMPT.template, ".", LONG["premise"], ROW["hypothesis"],
                           "hypothesis that is much longer"])


def test_layout_split_and_mask_slots(tok):
    enc = VerbalizerEncoder(tok, PROMPT, max_length=64)
    # "not sure" is two tokens -> K = 2 slots; short labels pad with IGNORE_INDEX
    assert enc.num_slots == 2
    true_id, not_id, sure_id, false_id = (ids_of(tok, w)[0] for w in ("True", "not", "sure", "False"))
    assert enc.slot_targets.tolist() == [[true_id, IGNORE_INDEX], [not_id, sure_id], [false_id, IGNORE_INDEX]]
    ex = enc.encode(ROW, label=1)
    # [BOS] the cat sat Question : a dog ran True , False or not sure ? Answer : -> 17 prompt tokens
    prompt_ids = ids_of(tok, "the cat sat Question: a dog ran True, False or not sure? Answer:")
    assert len(prompt_ids) == 17
    assert ex.input_ids == [tok.bos_token_id] + prompt_ids + [tok.mask_token_id] * 2 + ids_of(tok, ".") + [tok.eos_token_id]
    assert ex.split == 18 and ex.mask_positions == [18, 19]
    # prompt rows (< split) hold no answer slot; every slot is at or after split
    assert tok.mask_token_id not in ex.input_ids[:ex.split]
    assert all(p >= ex.split for p in ex.mask_positions)


def test_truncates_the_longest_field_and_counts_it(tok):
    # the template's fixed words: Question : | True , False or not sure ? Answer : = 11 tokens
    full = VerbalizerEncoder(tok, PROMPT, max_length=64).encode(LONG)
    assert len(full.input_ids) == 1 + (9 + 11 + 3) + 2 + 1 + 1   # premise 9, hypothesis 3
    report = RowReport()
    report.rows_seen = report.rows_kept = 1
    ex = VerbalizerEncoder(tok, PROMPT, max_length=23).encode(LONG, report=report)
    # room for 23 - 5 = 18 prompt tokens, 23 given: the premise (longest, 9) keeps 4
    assert len(ex.input_ids) == 23
    assert ex.input_ids[1:5] == ids_of(tok, "the cat sat on")
    assert ex.input_ids[5] == ids_of(tok, "Question")[0]
    assert report.truncated == {"premise": 1}
    # now the hypothesis is the longest field (8 vs 2): it is the one cut, 21 -> 17 tokens
    row = {"premise": "the cat", "hypothesis": "a dog ran hypothesis that is much longer"}
    report = RowReport()
    ex = VerbalizerEncoder(tok, PROMPT, max_length=22).encode(row, report=report)
    assert len(ex.input_ids) == 22 and report.truncated == {"hypothesis": 1}
    assert ex.input_ids[5:10] == ids_of(tok, "a dog ran hypothesis True")


def test_prompt_that_cannot_fit_is_dropped_and_counted(tok):
    report = RowReport()
    report.rows_seen = report.rows_kept = 1
    assert VerbalizerEncoder(tok, PROMPT, max_length=12).encode(ROW, report=report, source="f", line=3) is None
    assert report.counts == {SOURCE_TOO_LONG: 1}
    assert report.rows_kept == 0 and report.rows_dropped == 1


def _fake_logits(vocab, length, slots, probs):
    """logits whose log-softmax at slots[k] is log(probs[k]) (+7: a constant shift must not
    matter); probs[k] maps token id -> probability, the rest share what is left uniformly."""
    logits = torch.randn(length, vocab)
    for pos, p in zip(slots, probs):
        rest = (1 - sum(p.values())) / (vocab - len(p))
        row = torch.full((vocab,), rest)
        for token, value in p.items():
            row[token] = value
        logits[pos] = torch.log(row) + 7
    return logits


def test_label_scores_sum_token_log_probs(tok):
    enc = VerbalizerEncoder(tok, PROMPT, max_length=64)
    true_id, not_id, sure_id, false_id = (ids_of(tok, w)[0] for w in ("True", "not", "sure", "False"))
    a, b = enc.encode(ROW, label=1), enc.encode(LONG, label=0)
    batch = collate([a, b], pad_id=tok.pad_token_id)
    assert batch["mask_positions"].tolist() == [[18, 19], [24, 25]]   # per-row slots
    V, T = len(tok), batch["input_ids"].shape[1]
    logits = torch.stack([
        _fake_logits(V, T, [18, 19], [{true_id: .5, not_id: .3, false_id: .1}, {sure_id: .2}]),
        _fake_logits(V, T, [24, 25], [{true_id: .6, not_id: .1, false_id: .2}, {sure_id: .9}]),
    ])
    scores = label_scores(logits, batch["mask_positions"], enc.slot_targets)
    expected = [[math.log(.5), math.log(.3) + math.log(.2), math.log(.1)],
                [math.log(.6), math.log(.1) + math.log(.9), math.log(.2)]]
    torch.testing.assert_close(scores, torch.tensor(expected), atol=1e-5, rtol=0)
    assert predict_labels(logits, batch["mask_positions"], enc.slot_targets).tolist() == [0, 0]
    # CE over the label scores, gold "not sure" in row 0: -log(.06 / (.5 + .06 + .1)) = log 11
    loss0 = verbalizer_loss(logits[:1], batch["mask_positions"][:1], enc.slot_targets, torch.tensor([1]))
    assert loss0.item() == pytest.approx(math.log(11), abs=1e-5)
    # full-vocabulary NLL of the gold tokens: -(log .3 + log .2)
    vocab_loss = verbalizer_loss(logits[:1], batch["mask_positions"][:1], enc.slot_targets,
                                 torch.tensor([1]), over="vocab")
    assert vocab_loss.item() == pytest.approx(-math.log(.06), abs=1e-5)
    # gradients reach the slot logits only
    logits.requires_grad_(True)
    verbalizer_loss(logits, batch["mask_positions"], enc.slot_targets, batch["labels"]).backward()
    touched = logits.grad.abs().sum(-1).nonzero().tolist()
    assert touched == [[0, 18], [0, 19], [1, 24], [1, 25]]


def test_filler_scores_unused_slots(tok):
    enc = VerbalizerEncoder(tok, PROMPT, max_length=64, fill_short_labels_with=tok.pad_token_id)
    true_id, not_id, sure_id, false_id = (ids_of(tok, w)[0] for w in ("True", "not", "sure", "False"))
    ex = enc.encode(ROW)
    T, V = len(ex.input_ids), len(tok)
    logits = _fake_logits(V, T, [18, 19], [{true_id: .5, not_id: .3, false_id: .1},
                                           {sure_id: .2, tok.pad_token_id: .7}])[None]
    scores = label_scores(logits, torch.tensor([ex.mask_positions]), enc.slot_targets)
    assert scores[0].tolist() == pytest.approx(
        [math.log(.5 * .7), math.log(.3 * .2), math.log(.1 * .7)], abs=1e-5)


def test_label_tokens_follow_the_space_before_the_mask():
    """Byte-level BPE: the label word is tokenised with the space that precedes <mask>, so
    its ids are the ones the tokenizer gives for "... Answer: yes" as a whole."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    text = ["the cat sat on the mat. Question: is it yes or no? Answer: yes", "no maybe yes"] * 20
    backend.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<s>", "</s>", "<pad>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>", mask_token="<mask>")
    prompt = VerbalizerPrompt("{premise} Question: is it yes or no? Answer: <mask>", ("no", "yes", "maybe"))
    enc = VerbalizerEncoder(tok, prompt, max_length=64)
    whole = ids_of(tok, "the cat sat on the mat. Question: is it yes or no? Answer: maybe")
    ex = enc.encode({"premise": "the cat sat on the mat."})
    prompt_ids = ex.input_ids[1:ex.split]
    assert whole[:len(prompt_ids)] == prompt_ids
    assert whole[len(prompt_ids):] == enc.label_token_ids[2]
    assert tok.convert_ids_to_tokens(enc.label_token_ids[1])[0].startswith("Ġ")


def test_configured_prompts():
    assert set(PROMPTS) == {"mnli", "boolq", "cb", "copa", "rte", "wic"}
    assert PROMPTS["cb"].label_words == ("yes", "no", "maybe")   # “Scaling Effects of Instruction Tuning”'s CB label set
    assert TASKS["cb"].select == "macro_f1" and TASKS["rte"].select == "accuracy"
    assert TASKS["mnli"].eval_splits == ("validation_matched", "validation_mismatched")
    assert TASKS["copa_head"].kind == "head" and TASKS["copa"].prompt.fields == (
        "premise", "question", "choice1", "choice2")
    with pytest.raises(ValueError, match="exactly one <mask>"):
        VerbalizerPrompt("{a} <mask> <mask>", ("x", "y"))
    with pytest.raises(ValueError, match="before <mask>"):
        VerbalizerPrompt("{a} <mask> {b}", ("x", "y"))
