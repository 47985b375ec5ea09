"""The one model-shape record: the sizes that decide tensor layouts, FLOPs and HF configs.

Why a separate record: the weight mapping must run from a megatron checkpoint's config, from
our `BiGLMModelConfig`, or from a foreign HF config (a native EuroBERT of matching shape), and
the FLOPs count needs the same numbers, so all of them take this small frozen record instead of
any of those classes. It is validated once here, so a malformed shape fails before any tensor
is read. `BiGLMModelConfig` gives its own through `shape_of`.

`SHAPE_TABLE` is the one map of each field's name on every side (our config, megatron's
`TransformerConfig`, HF's `EuroBertConfig`, the config settings a start checkpoint hands a
fine-tune); `shape_from`, `shape_kwargs` and `config_settings` read it in every direction.
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


@dataclass(frozen=True)
class ShapeKey:
    """One row of `SHAPE_TABLE`: where one `BiGLMShape` field lives on each side.

    `ours` is the `BiGLMModelConfig` attribute that reads it (a property where derived);
    `setting` the config field that sets it directly (what a start checkpoint hands a
    fine-tune and what an HF import writes), None where the config derives it. `megatron` is
    the `TransformerConfig` field, `hf` the `EuroBertConfig` key; None where that side has no
    such field (megatron's model builder takes the vocabulary and tying, EuroBERT is always
    gated and holds the tokenizer's vocabulary).
    """

    field: str
    ours: str
    setting: str | None
    megatron: str | None
    hf: str | None


#: The one map of a model's shape between our config, megatron-core and HF (EuroBERT).
SHAPE_TABLE = (
    #        BiGLMShape            BiGLMModelConfig       its setting                             TransformerConfig     EuroBertConfig
    ShapeKey("num_layers",          "num_layers",          "num_layers",                           "num_layers",         "num_hidden_layers"),
    ShapeKey("hidden_size",         "hidden_size",         "hidden_size",                          "hidden_size",        "hidden_size"),
    ShapeKey("num_attention_heads", "num_attention_heads", "num_attention_heads",                  "num_attention_heads", "num_attention_heads"),
    ShapeKey("num_query_groups",    "query_groups",        "num_query_groups",                     "num_query_groups",   "num_key_value_heads"),
    ShapeKey("head_dim",            "head_dim",            None,                                   "kv_channels",        "head_dim"),
    ShapeKey("ffn_hidden_size",     "ffn_hidden_size",     "ffn_hidden_size",                      "ffn_hidden_size",    "intermediate_size"),
    ShapeKey("vocab_size",          "vocab_size",          "vocab_size",                           None,                 "vocab_size"),
    ShapeKey("padded_vocab_size",   "padded_vocab_size",   None,                                   None,                 None),
    ShapeKey("tie_word_embeddings", "tie_word_embeddings", "untie_embeddings_and_output_weights",  None,                 "tie_word_embeddings"),
    ShapeKey("gated_mlp",           "gated_mlp",           None,                                   "gated_linear_unit",  None),
)
#: The setting stored as the negation of its shape field.
NEGATED_SETTINGS = ("untie_embeddings_and_output_weights",)
#: Every `BiGLMModelConfig` field a shape is derived from: the table's settings, and the
#: multiple `padded_vocab_size` rounds `vocab_size` up to.
SHAPE_SETTINGS = tuple(row.setting for row in SHAPE_TABLE if row.setting) + ("make_vocab_size_divisible_by",)
#: Fields a side may leave unset (None or 0), as megatron and HF both do: one query group per
#: head (plain multi-head attention), and a head dim of hidden_size / num_attention_heads.
_UNSET = {"num_query_groups": lambda values: values["num_attention_heads"],
          "head_dim": lambda values: values["hidden_size"] // values["num_attention_heads"]}
_BOOLS = ("tie_word_embeddings", "gated_mlp")
SIDES = ("ours", "megatron", "hf")


def shape_kwargs(shape: BiGLMShape, side: str) -> dict:
    """The keyword arguments of `side`'s config ("megatron": `TransformerConfig`, "hf":
    `EuroBertConfig`) that carry `shape`; fields that side does not hold are left out."""
    return {getattr(row, side): getattr(shape, row.field) for row in SHAPE_TABLE if getattr(row, side)}


def shape_from(source, side: str, **given) -> BiGLMShape:
    """The shape `source` holds, read through `SHAPE_TABLE`'s `side` column ("ours": a
    `BiGLMModelConfig`, "megatron": a `TransformerConfig`, "hf": an HF EuroBERT config);
    `given` supplies the fields that side does not hold (megatron's vocabulary, HF's padding)."""
    if side not in SIDES:
        raise ValueError(f"side {side!r} is not one of {SIDES}")
    values = dict(given)
    for row in SHAPE_TABLE:
        key = getattr(row, side)
        if key is not None and row.field not in given:
            values[row.field] = getattr(source, key, None)
    for name, default in _UNSET.items():
        if name in values and not values[name]:
            values[name] = default(values)
    for name in _BOOLS:
        if name in values:
            values[name] = bool(values[name])
    return BiGLMShape(**values)


def config_settings(shape: BiGLMShape) -> dict:
    """The `BiGLMModelConfig` fields that set `shape` (derived fields are the config's own)."""
    return {row.setting: (not getattr(shape, row.field)) if row.setting in NEGATED_SETTINGS
            else getattr(shape, row.field) for row in SHAPE_TABLE if row.setting}


def shape_of(model_config) -> BiGLMShape:
    """The shape of our `BiGLMModelConfig` (embeddings tied unless the config says otherwise)."""
    return shape_from(model_config, "ours")
