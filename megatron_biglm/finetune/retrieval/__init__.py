"""Retrieval embeddings: pooled, optionally normalised encoder outputs with query/passage
prefixes (`embed`), training pairs from jsonl (`pairs`), BEIR-format evaluation (`beir`) and
an offline real data set built from the standard library's docstrings (`stdlib_set`). The
kind that trains them, with its InfoNCE loss, is `finetune/kinds/contrastive.py`.
"""
