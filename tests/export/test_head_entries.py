"""Every registered task head (`model/task_heads.py`) converts from its entry alone: its
weight-table rows carry a random head and trunk to HF and back bit-exactly, name exactly the
tensors (and shapes) of the transformers class the entry names, and the config.json fields it
writes make that class read the record's labels and give the record back."""
from __future__ import annotations

import pytest
import torch

from megatron_biglm.checkpoint.task_head import HeadRecord
from megatron_biglm.export import BiGLMShape, hf_tensor_shapes, hf_to_megatron, megatron_tensor_shapes
from megatron_biglm.export import megatron_to_hf
from megatron_biglm.export.weight_table import WEIGHT_TABLE, head_rows
from megatron_biglm.model.heads import HEADS, task_head
from megatron_biglm.model.task_heads import HF_RECORD_KEY, TaskHead

SHAPE = BiGLMShape(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=2,
                   head_dim=8, ffn_hidden_size=48, vocab_size=61, padded_vocab_size=64)
ENTRIES = sorted(name for name, entry in HEADS.items() if isinstance(entry, TaskHead))


def _record(name: str) -> HeadRecord:
    return HeadRecord(name, 2, "first", "single_label_classification", ("yes", "no"))


def _table(name: str):
    return WEIGHT_TABLE + head_rows(name, task_head(name).options_of(_record(name)))


def test_the_built_in_heads_are_entries():
    assert {"classification", "span"} <= set(ENTRIES)


@pytest.mark.parametrize("name", ENTRIES)
def test_rows_round_trip_bit_exactly(name):
    table = _table(name)
    shapes = megatron_tensor_shapes(SHAPE, table=table)
    head_tensors = {k for k in shapes if k.startswith("task_head.")}
    with torch.device("meta"):
        module = task_head(name).module(hidden_size=SHAPE.hidden_size, **task_head(name).options_of(_record(name)))
    assert head_tensors == {f"task_head.{k}" for k in module.state_dict()}  # every tensor of the head has its row
    gen = torch.Generator().manual_seed(3)
    megatron = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    hf = dict(megatron_to_hf(megatron, SHAPE, table=table))
    back = dict(hf_to_megatron(hf, SHAPE, table=table))
    for k in head_tensors:
        assert torch.equal(back[k], megatron[k]), k


@pytest.mark.parametrize("name", ENTRIES)
def test_rows_name_the_hf_class_tensors_and_the_config_gives_the_record_back(name):
    import transformers

    from megatron_biglm.export.hf_config import eurobert_config

    entry, record = task_head(name), _record(name)
    config = eurobert_config(SHAPE, rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=64,
                             mask_token_id=3)
    for key, value in entry.hf_fields(record).items():
        setattr(config, key, value)
    model = getattr(transformers, entry.hf_class)(config)
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    ours = hf_tensor_shapes(SHAPE, _table(name))
    assert ours == {k: v for k, v in theirs.items() if k != "lm_head.weight"}
    assert model.config.id2label == {0: "yes", 1: "no"} and model.config.num_labels == 2
    saved = model.config.to_dict()[HF_RECORD_KEY]
    assert saved == record.to_json()


def test_an_unknown_head_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"'no_such' is not a registered task head; task heads: \[.*'classification'"):
        head_rows("no_such", {})
    with pytest.raises(ValueError, match="not a registered task head"):
        task_head("masked_lm")  # a head, but not one with an export of its own
