"""The one model-shape record: the sizes that decide tensor layouts, FLOPs and HF configs.

Why a separate record: the weight mapping must run from a megatron checkpoint's config, from
our `BiGLMModelConfig`, or from a foreign HF config (a native EuroBERT of matching shape), and
the FLOPs count needs the same numbers, so all of them take this small frozen record instead of
any of those classes. It is validated once here, so a malformed shape fails before any tensor
is read. `BiGLMModelConfig` gives its own through `shape_of`.
"""
from __future__ import annotations

from dataclasses import dataclass


def check_positive_ints(obj, names, error) -> None:
    """Raise `error(name, value)` for the first of `names` on `obj` that is not a positive int
    (a bool is not)."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise error(name, value)


@dataclass(frozen=True)
class BiGLMShape:
    """Sizes that decide tensor names and layouts on both sides.

    `vocab_size` is the tokenizer's (HF) vocabulary; `padded_vocab_size` is megatron's
    embedding rows (padded for TP divisibility). Rows past `vocab_size` are dropped on export
    and zero-filled on import. `head_dim` is megatron's `kv_channels`.
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    padded_vocab_size: int | None = None
    tie_word_embeddings: bool = True
    gated_mlp: bool = True  # a gated MLP (SwiGLU: gate, up, down) has three matrices, a plain one two

    def __post_init__(self):
        check_positive_ints(self, ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                                   "head_dim", "ffn_hidden_size", "vocab_size"),
                            lambda name, value: ValueError(f"BiGLMShape.{name} must be a positive int, got {value!r}"))
        if self.padded_vocab_size is None:
            object.__setattr__(self, "padded_vocab_size", self.vocab_size)
        if self.padded_vocab_size < self.vocab_size:
            raise ValueError(
                f"padded_vocab_size {self.padded_vocab_size} < vocab_size {self.vocab_size}: "
                "megatron pads the vocabulary up, never down; pass the tokenizer's size as vocab_size")
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of "
                f"num_query_groups {self.num_query_groups} (GQA needs whole groups)")

    @property
    def heads_per_group(self) -> int:
        return self.num_attention_heads // self.num_query_groups

    @property
    def q_size(self) -> int:
        """Rows of the query projection (all heads)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Rows of the key (or value) projection (one head per query group)."""
        return self.num_query_groups * self.head_dim


def shape_of(model_config) -> BiGLMShape:
    """The shape of our `BiGLMModelConfig` (embeddings tied unless the config says otherwise)."""
    return BiGLMShape(
        num_layers=model_config.num_layers,
        hidden_size=model_config.hidden_size,
        num_attention_heads=model_config.num_attention_heads,
        num_query_groups=model_config.query_groups,
        head_dim=model_config.head_dim,
        ffn_hidden_size=model_config.ffn_hidden_size,
        vocab_size=model_config.vocab_size,
        padded_vocab_size=model_config.padded_vocab_size,
        tie_word_embeddings=not model_config.untie_embeddings_and_output_weights,
        gated_mlp=bool(model_config.gated_mlp),
    )
