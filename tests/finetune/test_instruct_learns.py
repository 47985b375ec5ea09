"""Instruction tuning works: a tiny model instruction-tuned with the
“Scaling Effects of Instruction Tuning” objective (InstructRecipe, through the common loop) on synthetic template tasks of
several families answers a HELD-OUT template task zero-shot well above chance; the same
model before instruction tuning stays at chance. The held-out task ("repeat the last word")
combines an instruction verb and a selector seen only apart (tests/fixtures/instruct_synthetic.py).

The answer is read as a prompt in the instruction template: the target is one `<mask>` slot
(split at it, as the biglm variant trains; this mlm-trained model read with split 0 scores
within 0.01 of that), the prediction the argmax over the vocabulary there. Chance:
one of the 12 content words (1/12), or 1/5 for a model that knows the answer is in the list.

Measured (2-layer, 64-wide model, batch 32, 2400 steps at lr 3e-3, WSD: constant, then a
linear decay to lr/10 over the last 20 %): held-out accuracy 0.00 before and 0.98 after; the
seen family "say the last word" 1.00. Other seeds (training.seed = data.seed): 0.91/0.89
(seed 11), 0.53/0.58 (seed 7, the slowest to leave the plateau). The accuracy climbs off its
plateau between ~1000 and ~2000 steps, so the lr stays high (WSD) rather than decaying from
the start; 2000 steps gave 0.93 here but 0.39 for seed 7.

Why WSD at lr 3e-3 rather than a linear decay from the start: the padding rows of the tiny
vocabulary (28 words padded to 128 embedding rows) get -inf logits (`model/loss.mask_padded_vocab`,
a 28-way cross entropy), and with them 1500 steps at lr 2e-3 with linear decay stay on the
plateau (held-out 0.05, seen 0.10).
The test takes ~75 s of CPU (one thread).

Variant `mlm` (split 0): a single copy family reached 100 % after ~250 steps with mlm and
~650 with biglm (split at the target start) on this tiny model, so mlm keeps the test inside
its CPU budget; the biglm split itself is checked in test_instruct_masking.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import instruct_synthetic as syn
from finetune_fixtures import word_tokenizer

STEPS, BATCH, SEQ, LR = 2400, 32, 32, 3e-3


def accuracy(module, tokenizer, rows) -> float:
    from megatron_biglm.finetune.instruct import TemplateEncoder

    encoder = TemplateEncoder(tokenizer, syn.TEMPLATE, max_length=SEQ)
    encoded = [encoder.encode_prompt(r["instruction"], r["input"], num_slots=1) for r in rows]
    width = max(len(e.ids) for e in encoded)
    tokens = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    for i, e in enumerate(encoded):
        tokens[i, :len(e.ids)] = torch.from_numpy(e.ids)
    split = torch.tensor([e.target_start for e in encoded])
    was_training = module.training
    module.eval()
    with torch.no_grad():
        logits = module(tokens, split=split, valid_lengths=torch.tensor([len(e.ids) for e in encoded]))
    module.train(was_training)
    predicted = logits[torch.arange(len(rows)), split].argmax(-1).tolist()
    answers = tokenizer.convert_tokens_to_ids([r["output"] for r in rows])
    return sum(p == a for p, a in zip(predicted, answers)) / len(rows)


def run(tmp_path, steps: int = STEPS, lr: float = LR, variant: str = "mlm", held_out: int = 200,
        seed: int = 1234) -> dict:
    """Instruction-tune; held-out accuracy before the first step and after the last, and the
    accuracy on one seen family (say the last word)."""
    from megatron_biglm.finetune.instruct import build_instruction_data
    from megatron_biglm.finetune.kinds.instruct import InstructRecipe
    from megatron_biglm.cli.train import train

    tokenizer = word_tokenizer(syn.vocabulary_texts())
    path = tmp_path / "train.jsonl"
    syn.write_jsonl(syn.training_rows(4000, seed=0), path)
    data, report = build_instruction_data([path], tokenizer, template=syn.TEMPLATE, max_length=SEQ, languages=None)
    assert report.rows_kept == 4000 and tokenizer.unk_token_id not in data.tokens
    held = syn.held_out_rows(held_out, seed=1)
    rng = np.random.default_rng(2)
    seen = [syn.example("say", "last", rng) for _ in range(100)]
    result = {}

    class Probe(InstructRecipe):
        def forward(self, model, batch, device):
            if "base" not in result:  # the first micro-batch: the model before any step
                result["base"] = accuracy(model.module, tokenizer, held)
            return super().forward(model, batch, device)

    def after(step, loop_state, ctx):  # noqa: ARG001
        if step == steps:
            result["tuned"] = accuracy(ctx.model_chunks[0].module, tokenizer, held)
            result["seen"] = accuracy(ctx.model_chunks[0].module, tokenizer, seen)

    class Callback:
        on_step = staticmethod(after)

    overrides = {
        "run_dir": str(tmp_path / "run"), "model.preset": "tiny", "model.num_layers": 2, "model.hidden_size": 64,
        "model.ffn_hidden_size": 192, "model.vocab_size": len(tokenizer), "data.seq_length": SEQ,
        "objective.variant": variant, "optimizer.lr": lr, "optimizer.min_lr": lr / 10,
        "optimizer.weight_decay": 0.01, "schedule.style": "wsd", "schedule.train_steps": steps,
        "schedule.warmup_steps": 20, "training.micro_batch_size": BATCH, "training.global_batch_size": BATCH,
        "training.precision": "fp32", "training.eval_interval": 0, "training.eval_iters": 0,
        "logging.log_interval": 100, "logging.tensorboard": False, "logging.progress": "plain",
        "checkpoint.save_interval": 10_000, "checkpoint.save_at_end": False,
        "training.seed": seed, "data.seed": seed}  # pinned: the bars below were measured per seed
    from megatron_biglm.config import FinetuneConfig
    from megatron_biglm.finetune.tasks import get_task

    task = {"kind": "instruct", "eval_splits": []}
    recipe = Probe(get_task(task), tokenizer, FinetuneConfig(task=task, data={"train": data}))
    train(None, [f"{k}={v}" for k, v in overrides.items()], recipe=recipe, callbacks=[Callback()])
    return result


@pytest.mark.slow
def test_instruction_tuned_model_answers_a_held_out_task(tmp_path):
    result = run(tmp_path)
    print(f"held-out accuracy: base {result['base']:.3f}, instruction-tuned {result['tuned']:.3f}; "
          f"seen family {result['seen']:.3f}")
    # Bars: chance + 1/3 of the smallest gain over it, taking as chance the 0.2 of a model that
    # knows the answer is one of the 5 listed words (stricter than the 1/12 over all content
    # words). Measured (training.seed = data.seed; 3 seeds, not 5: a run is ~75 s of an idle
    # core, minutes on a shared one): held-out 0.98 / 0.91 / 0.53, seen 1.00 / 0.89 / 0.58 for
    # seeds 1234 (the one pinned here) / 11 / 7, so 0.2 + (0.53 - 0.2) / 3 = 0.31 and
    # 0.2 + (0.58 - 0.2) / 3 = 0.33. Before any step: 0.00.
    assert result["base"] <= 0.2           # chance: 1/12 over the content words
    assert result["tuned"] >= 0.3          # zero-shot, on a combination never trained on
    assert result["seen"] >= 0.3           # a trained family (sanity: the run learned at all)
