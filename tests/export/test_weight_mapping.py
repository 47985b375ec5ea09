"""megatron <-> HF weight mapping and TP shard helpers, on random tensors (no model needed).

Numerical parity of the mapping against a real megatron-core model is in test_hf_model.py.
"""
from __future__ import annotations

import itertools
import weakref

import pytest
import torch

from megatron_biglm.export import BiGLMShape, ConversionReport, WeightMappingError
from megatron_biglm.export import hf_tensor_shapes, megatron_tensor_shapes
from megatron_biglm.export import hf_to_megatron, megatron_to_hf
from megatron_biglm.export import merge_tp_shards, split_for_tp, tp_partition_dim
from megatron_biglm.export.weight_mapping import fc1_to_hf, qkv_from_hf, qkv_to_hf

SHAPES = [
    # MHA, tied, no padding
    BiGLMShape(num_layers=2, hidden_size=32, num_attention_heads=4, num_query_groups=4,
               head_dim=8, ffn_hidden_size=48, vocab_size=50),
    # GQA 3:1 (the 136M preset's ratio), padded vocab
    BiGLMShape(num_layers=3, hidden_size=48, num_attention_heads=6, num_query_groups=2,
               head_dim=8, ffn_hidden_size=40, vocab_size=61, padded_vocab_size=64),
    # MQA, head_dim != hidden/heads, untied output layer (native EuroBERT checkpoints are untied)
    BiGLMShape(num_layers=1, hidden_size=40, num_attention_heads=4, num_query_groups=1,
               head_dim=12, ffn_hidden_size=24, vocab_size=33, padded_vocab_size=40,
               tie_word_embeddings=False),
]


def random_state(shapes: dict, seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


@pytest.mark.parametrize("shape", SHAPES, ids=["mha", "gqa-padded", "mqa-untied"])
def test_hf_megatron_hf_is_bit_identical(shape):
    for seed in range(5):
        hf = random_state(hf_tensor_shapes(shape), seed)
        megatron = dict(hf_to_megatron(hf, shape))
        assert {k: tuple(v.shape) for k, v in megatron.items()} == megatron_tensor_shapes(shape)
        back = dict(megatron_to_hf(megatron, shape))
        assert list(back) == list(hf_tensor_shapes(shape))
        for name, tensor in hf.items():
            assert torch.equal(back[name], tensor), name


@pytest.mark.parametrize("shape", SHAPES, ids=["mha", "gqa-padded", "mqa-untied"])
@pytest.mark.parametrize("norm_naming", ["local", "te"])
def test_megatron_hf_megatron_is_bit_identical_except_vocab_padding(shape, norm_naming):
    megatron = random_state(megatron_tensor_shapes(shape, norm_naming), seed=7)
    megatron["decoder.layers.0.self_attention.linear_qkv._extra_state"] = None
    report = ConversionReport()
    hf = dict(megatron_to_hf(megatron, shape, report=report))
    assert report.converted == len(hf) == len(hf_tensor_shapes(shape))
    assert list(report.ignored) == ["decoder.layers.0.self_attention.linear_qkv._extra_state"]
    back = dict(hf_to_megatron(hf, shape, norm_naming=norm_naming))
    assert set(back) == set(megatron_tensor_shapes(shape, norm_naming))
    v = shape.vocab_size
    for name, tensor in back.items():
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            assert torch.equal(tensor[:v], megatron[name][:v])
            assert torch.count_nonzero(tensor[v:]) == 0  # padding rows come back as zeros
        else:
            assert torch.equal(tensor, megatron[name]), name


def test_no_two_outputs_share_storage():
    """safetensors refuses shared storage; a slice returned as a view would alias its input."""
    shape = SHAPES[1]
    megatron = random_state(megatron_tensor_shapes(shape), seed=3)
    hf = dict(megatron_to_hf(megatron, shape))
    inputs = {t.untyped_storage().data_ptr() for t in megatron.values()}
    sliced = [n for n in hf if any(s in n for s in ("q_proj", "k_proj", "v_proj", "gate", "up_proj", "embed"))]
    for name in sliced:
        assert hf[name].untyped_storage().data_ptr() not in inputs, name
    ptrs = [t.untyped_storage().data_ptr() for t in hf.values()]
    assert len(ptrs) == len(set(ptrs))


def test_qkv_layout_matches_megatron_grouping():
    """Row labels: megatron group g holds [q heads g*r..g*r+r-1, k head g, v head g]."""
    shape = BiGLMShape(num_layers=1, hidden_size=4, num_attention_heads=6, num_query_groups=2,
                       head_dim=3, ffn_hidden_size=4, vocab_size=8)
    r, d = shape.heads_per_group, shape.head_dim
    rows = []  # label = 1000*kind + 10*head + dim, kind 1=q 2=k 3=v
    for g in range(shape.num_query_groups):
        rows += [1000 + 10 * (g * r + h) + i for h in range(r) for i in range(d)]
        rows += [2000 + 10 * g + i for i in range(d)]
        rows += [3000 + 10 * g + i for i in range(d)]
    qkv = torch.tensor(rows, dtype=torch.float64)[:, None].expand(-1, shape.hidden_size)
    q, k, v = qkv_to_hf(qkv, shape)
    assert q[:, 0].tolist() == [1000 + 10 * h + i for h in range(6) for i in range(d)]
    assert k[:, 0].tolist() == [2000 + 10 * g + i for g in range(2) for i in range(d)]
    assert v[:, 0].tolist() == [3000 + 10 * g + i for g in range(2) for i in range(d)]
    assert torch.equal(qkv_from_hf(q, k, v, shape), qkv)
    gate, up = fc1_to_hf(torch.arange(8.0)[:, None])
    assert gate[:, 0].tolist() == [0, 1, 2, 3] and up[:, 0].tolist() == [4, 5, 6, 7]


def test_key_and_shape_errors_are_clear():
    shape = SHAPES[0]
    megatron = random_state(megatron_tensor_shapes(shape), seed=0)
    missing = dict(megatron)
    del missing["decoder.layers.1.mlp.linear_fc2.weight"]
    with pytest.raises(WeightMappingError, match="1 expected megatron tensors are missing"):
        megatron_to_hf(missing, shape)
    extra = dict(megatron, **{"decoder.layers.5.mlp.linear_fc2.weight": torch.zeros(1)})
    with pytest.raises(WeightMappingError, match="not part of BiGLM"):
        megatron_to_hf(extra, shape)
    with pytest.raises(WeightMappingError, match="strip the DDP"):
        megatron_to_hf({"module." + k: v for k, v in megatron.items()}, shape)
    wrong_ffn = BiGLMShape(**{**shape.__dict__, "ffn_hidden_size": 40})
    with pytest.raises(WeightMappingError, match=r"has shape \(96, 32\) but the config implies \(80, 32\)"):
        list(megatron_to_hf(megatron, wrong_ffn))
    hf = random_state(hf_tensor_shapes(shape), seed=1)
    with pytest.raises(WeightMappingError, match="differs from model.embed_tokens.weight"):
        list(hf_to_megatron(dict(hf, **{"lm_head.weight": torch.randn(50, 32)}), shape))
    report = ConversionReport()
    tied_copy = dict(hf, **{"lm_head.weight": hf["model.embed_tokens.weight"].clone()})
    list(hf_to_megatron(tied_copy, shape, report=report))
    assert report.ignored == {"lm_head.weight": "tied copy of the word embeddings"}


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="not a multiple of num_query_groups"):
        BiGLMShape(num_layers=1, hidden_size=8, num_attention_heads=3, num_query_groups=2,
                   head_dim=4, ffn_hidden_size=8, vocab_size=10)
    with pytest.raises(ValueError, match="pads the vocabulary up"):
        BiGLMShape(num_layers=1, hidden_size=8, num_attention_heads=2, num_query_groups=2,
                   head_dim=4, ffn_hidden_size=8, vocab_size=10, padded_vocab_size=8)


# ----------------------------------------------------------------------------- TP shards


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_tp_split_merge_round_trip(tp):
    shape = BiGLMShape(num_layers=1, hidden_size=16, num_attention_heads=8, num_query_groups=4,
                       head_dim=2, ffn_hidden_size=24, vocab_size=60, padded_vocab_size=64)
    full = random_state(megatron_tensor_shapes(shape), seed=tp)
    for name, tensor in full.items():
        shards = split_for_tp(name, tensor, tp)
        assert len(shards) == tp
        dim = tp_partition_dim(name)
        if dim is not None:
            assert all(s.shape[dim] * tp == tensor.shape[dim] for s in shards)
        assert torch.equal(merge_tp_shards(name, shards), tensor), name


def test_tp_glu_fc1_shard_holds_its_gate_and_up_slices():
    """Rank r holds [gate rows of r; up rows of r], as megatron's swiglu sharded factory stores."""
    ffn, tp = 6, 3
    fc1 = torch.arange(2 * ffn, dtype=torch.float32)[:, None]  # rows 0..5 gate, 6..11 up
    shards = split_for_tp("decoder.layers.0.mlp.linear_fc1.weight", fc1, tp)
    assert [s[:, 0].tolist() for s in shards] == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10, 11]]
    plain = split_for_tp("decoder.layers.0.mlp.linear_fc1.weight", fc1, tp, gated_fc1=False)
    assert [s[:, 0].tolist() for s in plain] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert tp_partition_dim("decoder.layers.3.self_attention.linear_proj.weight") == 1
    assert tp_partition_dim("decoder.layers.3.mlp.linear_fc1.layer_norm_weight") is None


def test_tp_errors():
    with pytest.raises(ValueError, match="does not split into 2 equal"):
        split_for_tp("embedding.word_embeddings.weight", torch.zeros(7, 4), 2)
    with pytest.raises(ValueError, match="rank 1's copy differs"):
        merge_tp_shards("decoder.final_layernorm.weight", [torch.ones(4), torch.zeros(4)])
    with pytest.raises(ValueError, match="no tensor-parallel rule"):
        tp_partition_dim("decoder.layers.0.mlp.router.weight")


def test_qkv_tp_shards_keep_whole_query_groups():
    """A plain dim-0 split of the interleaved QKV gives each rank complete groups."""
    shape = BiGLMShape(num_layers=1, hidden_size=4, num_attention_heads=4, num_query_groups=2,
                       head_dim=2, ffn_hidden_size=4, vocab_size=8)
    qkv = torch.randn(shape.q_size + 2 * shape.kv_size, 4, generator=torch.Generator().manual_seed(0))
    q, k, v = qkv_to_hf(qkv, shape)
    local = BiGLMShape(**{**shape.__dict__, "num_attention_heads": 2, "num_query_groups": 1})
    for rank, shard in enumerate(split_for_tp("decoder.layers.0.self_attention.linear_qkv.weight", qkv, 2)):
        lq, lk, lv = qkv_to_hf(shard, local)
        rows = slice(rank * local.q_size, (rank + 1) * local.q_size)
        kv_rows = slice(rank * local.kv_size, (rank + 1) * local.kv_size)
        assert torch.equal(lq, q[rows]) and torch.equal(lk, k[kv_rows]) and torch.equal(lv, v[kv_rows])


#: megatron's layers: ColumnParallelLinear / VocabParallelEmbedding shard dim 0,
#: RowParallelLinear dim 1, norms are replicated.
EXPECTED_TP_DIM = {
    "embedding.word_embeddings.weight": 0, "output_layer.weight": 0,
    "self_attention.linear_qkv.weight": 0, "mlp.linear_fc1.weight": 0,
    "self_attention.linear_proj.weight": 1, "mlp.linear_fc2.weight": 1,
    "input_layernorm.weight": None, "pre_mlp_layernorm.weight": None,
    "self_attention.linear_qkv.layer_norm_weight": None, "mlp.linear_fc1.layer_norm_weight": None,
    "decoder.final_layernorm.weight": None,
}


def test_every_megatron_name_has_a_tp_rule():
    seen = set()
    for shape, naming in itertools.product(SHAPES, ["local", "te"]):
        for name in megatron_tensor_shapes(shape, naming):
            suffix = next(k for k in EXPECTED_TP_DIM if name.endswith(k))
            assert tp_partition_dim(name) == EXPECTED_TP_DIM[suffix], name
            seen.add(suffix)
    assert seen == set(EXPECTED_TP_DIM) - {"output_layer.weight"} or seen == set(EXPECTED_TP_DIM)


class LazyState(dict):
    """A Mapping that materialises each tensor on access and tracks how many are alive."""

    def __init__(self, shapes: dict, seed: int):
        super().__init__({name: None for name in shapes})
        self.shapes, self.seed, self.loads, self.max_alive = shapes, seed, {}, 0
        self._alive = weakref.WeakSet()

    def __getitem__(self, name):
        self.loads[name] = self.loads.get(name, 0) + 1
        gen = torch.Generator().manual_seed(self.seed + sorted(self.shapes).index(name))
        tensor = torch.randn(self.shapes[name], generator=gen)
        self._alive.add(tensor)
        self.max_alive = max(self.max_alive, len(self._alive))
        return tensor


@pytest.mark.parametrize("direction", ["megatron_to_hf", "hf_to_megatron"])
def test_conversion_streams_one_input_at_a_time(direction):
    """What lets a 3.5B model convert without two full copies: each input is read once, and
    inputs are released as soon as their outputs are produced (QKV needs 3 at most)."""
    shape = SHAPES[1]
    if direction == "megatron_to_hf":
        state, convert = LazyState(megatron_tensor_shapes(shape), 0), megatron_to_hf
    else:
        state, convert = LazyState(hf_tensor_shapes(shape), 0), hf_to_megatron
    produced = 0
    for _name, tensor in convert(state, shape):
        produced += tensor.numel()
        del tensor
    assert state.loads == {name: 1 for name in state.shapes}
    assert state.max_alive <= 3
    assert produced > 0


def test_a_new_head_is_one_table_row_and_both_directions_follow(monkeypatch):
    """The table is the only place that knows names: a head with weights (here a made-up
    sequence classifier, with a layout change on the way) converts both ways once its row
    is added, and its tensors are checked like every other."""
    from megatron_biglm.export import weight_table
    from megatron_biglm.export.weight_table import MappingRow

    labels = 3
    row = MappingRow(  # megatron keeps [labels, h]; this HF side keeps its transpose
        ("heads.classifier.weight",), ("classifier.weight",),
        lambda t, s: (t[0].t().contiguous(),), lambda t, s: (t[0].t().contiguous(),),
        lambda s: ((labels, s.hidden_size),), lambda s: ((s.hidden_size, labels),))
    monkeypatch.setattr(weight_table, "WEIGHT_TABLE", weight_table.WEIGHT_TABLE + (row,))
    shape = SHAPES[1]
    assert hf_tensor_shapes(shape)["classifier.weight"] == (shape.hidden_size, labels)
    assert megatron_tensor_shapes(shape)["heads.classifier.weight"] == (labels, shape.hidden_size)
    megatron = random_state(megatron_tensor_shapes(shape), seed=11)
    hf = dict(megatron_to_hf(megatron, shape))
    assert torch.equal(hf["classifier.weight"], megatron["heads.classifier.weight"].t())
    back = dict(hf_to_megatron(hf, shape))
    assert torch.equal(back["heads.classifier.weight"], megatron["heads.classifier.weight"])
    del hf["classifier.weight"]
    with pytest.raises(WeightMappingError, match="1 expected HF tensors are missing"):
        hf_to_megatron(hf, shape)
