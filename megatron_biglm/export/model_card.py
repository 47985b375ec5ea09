"""The README.md model card of an exported BiGLM directory, from the checkpoint's own records.

Everything in it is read from what the run saved (resolved run config, train state), never
typed by hand: preset and shape, objective settings, tokens trained on, and how to apply
BiGLM's split attention to the exported (native EuroBERT) model.
"""
from __future__ import annotations

import json


def _rows(pairs) -> str:
    return "\n".join(f"| {k} | {v} |" for k, v in pairs)


def model_card(checkpoint, *, parameters: int, tokenizer_source: str, dtype: str) -> str:
    """Markdown for `checkpoint` (a `config.trained_checkpoint.TrainedCheckpoint`)."""
    mc, cfg = checkpoint.model_config, checkpoint.run_config
    preset = cfg.model.get("preset")
    shape = [("preset", f"`{preset}`" + (f" (name `{mc.name}`)" if mc.name and mc.name != preset else "")),
             ("parameters", f"{parameters:,} (tied input/output embedding counted once)"),
             ("layers / hidden / FFN", f"{mc.num_layers} / {mc.hidden_size} / {mc.ffn_hidden_size}"),
             ("heads / KV groups / head dim", f"{mc.num_attention_heads} / {mc.query_groups} / {mc.head_dim}"),
             ("vocabulary", f"{mc.vocab_size} (megatron pads to {mc.padded_vocab_size}; padding not exported)"),
             ("max positions / RoPE base / RMSNorm eps",
              f"{mc.seq_length} / {mc.rotary_base:g} / {mc.norm_epsilon:g}"),
             ("weights dtype", dtype), ("tokenizer", f"`{tokenizer_source}`")]
    if checkpoint.weights_only:
        source = checkpoint.train_state.get("source", {})
        training = [("origin", f"imported from `{source.get('hf_dir', '?')}` "
                               f"(model_type `{source.get('model_type', '?')}`); no BiGLM training since")]
        objective = "Not recorded: this checkpoint was imported, not trained by megatron-biglm."
    else:
        tokens = checkpoint.training_tokens
        training = [("iteration", checkpoint.train_state.get("iteration")),
                    ("consumed samples", f"{checkpoint.consumed_samples:,}"),
                    ("sequence length", cfg.data.seq_length),
                    ("training tokens", f"{tokens:,} (consumed samples × sequence length)"),
                    ("schedule", f"{cfg.schedule.style}, lr {cfg.optimizer.lr:g} -> {cfg.optimizer.min_lr:g}, "
                                 f"{cfg.schedule.train_steps} steps planned"),
                    ("global batch", cfg.training.global_batch_size)]
        settings = cfg.objective.resolved.to_dict()
        objective = "```json\n" + json.dumps(settings, indent=1) + "\n```"
    return f"""---
library_name: transformers
pipeline_tag: fill-mask
tags: [biglm, eurobert, masked-lm, megatron-biglm]
---

# BiGLM `{preset}`

A BiGLM encoder (bidirectional general language model) trained with megatron-biglm and
exported from `{checkpoint.path}`. The architecture is exactly transformers' native
`EuroBertForMaskedLM` (pre-norm RMSNorm, RoPE, SwiGLU, GQA, no biases, tied MLM head), so it
loads without remote code:

```python
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline
model = AutoModelForMaskedLM.from_pretrained("path/to/this/dir")
fill = pipeline("fill-mask", model="path/to/this/dir")
```

## Model

| field | value |
|---|---|
{_rows(shape)}

## Training

| field | value |
|---|---|
{_rows(training)}

Objective settings (`megatron_biglm.objective.ObjectiveConfig`, resolved):

{objective}

## BiGLM's split attention

BiGLM is trained with a prefix/suffix split: prefix tokens attend to the prefix only, suffix
tokens to everything. Plain calls (and `pipeline("fill-mask")`) use full attention. To apply
the split, pass a 4D additive mask `[batch, 1, seq, seq]` (0 = attend, dtype minimum = blocked)
with the `eager` or `sdpa` attention implementation:

```python
import torch
seq, split = input_ids.shape[1], 5  # first 5 tokens form the prefix
q, k = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
blocked = (k >= split) & (q < split)
mask = torch.zeros(1, 1, seq, seq).masked_fill(blocked, torch.finfo(torch.float32).min)
logits = model(input_ids=input_ids, attention_mask=mask).logits
```

(`megatron_biglm.export.forward_with_split(model, input_ids, split)` does this, padding included.)

No `generation_config.json` is shipped: a masked LM has no `generate()`; BiGLM's mask-predict
generation lives in `megatron_biglm.generation`.
"""
