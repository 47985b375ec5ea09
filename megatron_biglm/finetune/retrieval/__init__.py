"""Retrieval embeddings: pooled, optionally normalised encoder outputs with query/passage
prefixes (`embed`), the InfoNCE loss with cross-rank negatives (`infonce`), training pairs
from jsonl (`pairs`), BEIR-format evaluation (`beir`) and an offline real data set built from
the standard library's docstrings (`stdlib_set`). The recipe is `finetune/recipes/contrastive.py`.
"""
