"""A word-level fast tokenizer for the fine-tuning tests: one token per word or punctuation
run, with character offsets, so expected ids and positions can be worked out by hand."""
from __future__ import annotations

import re

SPECIALS = ["<s>", "</s>", "<pad>", "<mask>", "<unk>"]  # ids 0..4


def word_tokenizer(texts):
    """A PreTrainedTokenizerFast whose vocabulary is SPECIALS + every word of `texts` in
    first-seen order (ids from 5), splitting like `tokenizers`' Whitespace pre-tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for text in texts:
        for word in re.findall(r"\w+|[^\w\s]+", text):
            vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", mask_token="<mask>", unk_token="<unk>")


def ids_of(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_rows(task, rows, tokenizer, *, max_length, report=None, training=True, **options):
    """The examples `task`'s kind encodes from `rows` (`options`: its `finetune.options`), as a
    fine-tune does."""
    from megatron_biglm.config import FinetuneConfig
    from megatron_biglm.finetune.kinds import recipe_for

    recipe = recipe_for(task, tokenizer, FinetuneConfig(task=task.name, max_length=max_length, options=options))
    return recipe.encode(rows, report, training)
