"""Seq2seq fine-tuning learns, and Mask-Predict decodes what it learned (issue 12's learnable
acceptance, issue 13's seq2seq one).

A tiny BiGLM with the CMLM length head is trained *inside the test*, through the one training
loop with `Seq2SeqRecipe`, to reverse a random sequence of 3..8 words (target = source
reversed, so the length head must count the source). The checkpoint is then loaded for
inference (the length head travels with it), and Mask-Predict, with the head's top-3 lengths
decoded in parallel (the length beam), must write the exact reversal of held-out sources.
A broken split mask, target masking, length loss or decoder leaves the model (or its decoding)
short of the 90 % bars.
"""
from __future__ import annotations

import numpy as np
import pytest

from train_fixtures import tiny_overrides, train_data  # noqa: F401 (fixture)

import os
STEPS, BATCH, MIN_LEN, MAX_LEN = int(os.environ.get("G2_STEPS", 800)), 32, 3, int(os.environ.get("G2_MAX", 6))
LAYERS, HIDDEN = int(os.environ.get("G2_LAYERS", 4)), int(os.environ.get("G2_HIDDEN", 64))


def single_token_words(tokenizer, count: int) -> list[tuple[str, int]]:
    """`count` words that the tokenizer keeps as one token each after a space."""
    out = []
    for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        word = token[1:]
        if token.startswith("\u0120") and word.isalpha() and len(word) >= 3:
            if tokenizer(" " + word, add_special_tokens=False)["input_ids"] == [idx]:
                out.append((word, idx))
        if len(out) == count:
            return out
    raise AssertionError("the test tokenizer has too few single-token words")


def reverse_task(words, n: int, seed: int, exclude=frozenset()):
    """(source ids, target ids) pairs, sources distinct and not in `exclude`."""
    rng = np.random.default_rng(seed)
    ids = [i for _, i in words]
    seen, out = set(exclude), []
    while len(out) < n:
        length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        source = tuple(int(x) for x in rng.choice(ids, size=length))
        if source not in seen:
            seen.add(source)
            out.append((list(source), list(source[::-1])))
    return out


@pytest.mark.slow
def test_reverse_task_learned_and_decoded_by_mask_predict(train_data, tmp_path):  # noqa: F811
    from megatron_biglm.data.tokenizer import load_tokenizer
    from megatron_biglm.finetune.recipes.seq2seq import Seq2SeqRecipe
    from megatron_biglm.finetune.tasks.seq2seq import Seq2SeqExample
    from megatron_biglm.generation import GenerationConfig, MaskPredictGenerator
    from megatron_biglm.inference import inference_token_ids
    from megatron_biglm.inference.megatron_adapter import MegatronMaskedLMAdapter
    from megatron_biglm.inference.loading import load_megatron_checkpoint
    from megatron_biglm.train import train
    from train_fixtures import train_records

    tok = load_tokenizer(train_data.tokenizer)
    words = single_token_words(tok, 12)
    train_pairs = reverse_task(words, 3000, seed=0)
    held_out = reverse_task(words, 100, seed=1, exclude={tuple(s) for s, _ in train_pairs})
    bos = tok.bos_token_id
    examples = [Seq2SeqExample([bos] + s + t, 1 + len(s), len(t)) for s, t in train_pairs]
    recipe = Seq2SeqRecipe(None, tok, {"max_length": 1 + MAX_LEN, "max_target_length": MAX_LEN,
                                       "length_loss_weight": 1.0})
    recipe.set_examples(examples)
    run = tmp_path / "run"
    train(None, tiny_overrides(train_data, run, steps=STEPS, **{
        "model.length_head_max": MAX_LEN, "model.num_layers": LAYERS, "model.hidden_size": HIDDEN,
        "model.ffn_hidden_size": 3 * HIDDEN, "data.seq_length": 1 + 2 * MAX_LEN,
        "training.micro_batch_size": BATCH, "training.global_batch_size": BATCH,
        "schedule.warmup_steps": 20, "optimizer.lr": 3e-3, "logging.log_interval": 50,
        "checkpoint.save_interval": STEPS}), recipe=recipe)
    last = train_records(run)[STEPS]
    print(f"step {STEPS}: loss {last['loss']:.3f}, masked acc {last['masked_accuracy']:.3f}, "
          f"length acc {last['length_accuracy']:.3f}")

    loaded = load_megatron_checkpoint(run / "checkpoints", tokenizer=tok)
    assert loaded.model.length_head is not None  # the head came back with the checkpoint
    adapter = MegatronMaskedLMAdapter(loaded.model, inference_token_ids(tok), vocab_size=len(tok),
                                      max_length=1 + 2 * MAX_LEN)
    import torch
    prefixes = [[bos] + s for s, _ in held_out]
    width = max(len(p) for p in prefixes)
    ids = torch.tensor([p + [tok.pad_token_id] * (width - len(p)) for p in prefixes])
    top1 = adapter.predict_lengths(ids, torch.tensor([len(p) for p in prefixes]), 1)[:, 0]
    length_acc = float((top1 == torch.tensor([len(s) for s, _ in held_out])).float().mean())

    prompts = ["".join(" " + dict((i, w) for w, i in words)[x] for x in s) for s, _ in held_out]
    generator = MaskPredictGenerator(adapter, tok)
    exact = {}
    for beam in (1, 3):  # the head's top-1 length; its top-3 decoded in parallel (length beam)
        outputs = generator.generate(prompts, GenerationConfig(steps=4, length_beam=beam))
        exact[beam] = float(np.mean([o.ids == t for o, (_, t) in zip(outputs, held_out)]))
    print(f"held-out: length head accuracy {length_acc:.3f}, Mask-Predict exact match {exact}")
    assert length_acc >= 0.9
    assert exact[1] >= 0.9

    # the HF export carries the head in length_head.safetensors: same lengths, same ids
    from transformers import AutoModelForMaskedLM

    from megatron_biglm.export.convert_to_hf import to_hf
    from megatron_biglm.inference.hf_adapter import HFMaskedLMAdapter
    from megatron_biglm.inference.length_head_file import load_length_head

    to_hf(run / "checkpoints", tmp_path / "hf", progress=False)
    hf = HFMaskedLMAdapter(AutoModelForMaskedLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32),
                           inference_token_ids(tok), length_head=load_length_head(tmp_path / "hf"))
    lengths = torch.tensor([len(p) for p in prefixes])
    assert torch.equal(hf.predict_lengths(ids, lengths, 3), adapter.predict_lengths(ids, lengths, 3))
    config = GenerationConfig(steps=4)
    assert [o.ids for o in MaskPredictGenerator(hf, tok).generate(prompts[:20], config)] == \
        [o.ids for o in generator.generate(prompts[:20], config)]
