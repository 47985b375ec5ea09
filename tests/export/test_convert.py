"""Checkpoint conversion HF <-> megatron-biglm in one process: round trips and refusals.

The megatron side is a real dist checkpoint in the trainer's layout, written by `from_hf`
(megatron model chunk + dist_checkpointing) and read back by `to_hf`. Multi-process layouts
and parity against trained models are in test_convert_parity.py.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from convert_fixtures import fixed_batch, hf_state, random_eurobert_source, train_tokenizer, write_random_eurobert
from megatron_biglm.cli.convert import main as cli_main
from megatron_biglm.export.convert_from_hf import from_hf
from megatron_biglm.export.convert_to_hf import ConversionError, to_hf
from megatron_biglm.checkpoint.dist_reader import DistCheckpointReadError, DistCheckpointWeights
from megatron_biglm.export.hf_config import UnsupportedArchitecture
from megatron_biglm.export.hf_files import CheckpointFileError
from megatron_biglm.data.tokenizer_check import TokenizerMismatch
from megatron_biglm.checkpoint.dirs import CheckpointError


@pytest.fixture(scope="module")
def source_dir(tokenizer_dir, tmp_path_factory):
    """A native EuroBERT written by transformers, with our tokenizer (vocab 400, padded 512)."""
    return random_eurobert_source(tokenizer_dir, tmp_path_factory, seed=1)


@pytest.fixture(scope="module")
def imported(source_dir, tmp_path_factory):
    """source_dir imported at TP=1/PP=1, in this process."""
    out = tmp_path_factory.mktemp("imported") / "ckpt"
    summary = from_hf(source_dir, out, progress=False)
    return out, summary


def test_round_trip_hf_megatron_hf_is_bit_identical(source_dir, imported, tmp_path):
    from transformers import AutoModelForMaskedLM

    ckpt, import_summary = imported
    assert import_summary.max_abs_diff == 0.0 and import_summary.tensors == 14
    assert import_summary.output_parameters - import_summary.source_parameters == (512 - 400) * 64
    summary = to_hf(ckpt, tmp_path / "back", progress=False)
    assert summary.max_abs_diff == 0.0 and summary.output_parameters == import_summary.source_parameters
    before, after = hf_state(source_dir), hf_state(tmp_path / "back")
    assert sorted(before) == sorted(after)
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype and torch.equal(after[name], tensor), name
    src_cfg = json.loads((source_dir / "config.json").read_text())
    back_cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    for key in ("model_type", "rope_parameters", "rms_norm_eps", "num_key_value_heads", "head_dim",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings", "mask_token_id",
                "pad_token_id", "bos_token_id", "eos_token_id"):
        assert back_cfg[key] == src_cfg[key], key
    ids, split = fixed_batch(400)
    a = AutoModelForMaskedLM.from_pretrained(str(source_dir), attn_implementation="eager").eval()
    b = AutoModelForMaskedLM.from_pretrained(str(tmp_path / "back"), attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)


def test_imported_checkpoint_is_weights_only_in_the_trainer_layout(source_dir, imported):
    from megatron_biglm.config.trained_checkpoint import open_checkpoint
    from megatron_biglm.checkpoint.signature import signature_of
    from megatron_biglm.model import load_preset
    from megatron_biglm.checkpoint.dirs import resolve_load_path

    ckpt, _ = imported
    assert resolve_load_path(ckpt, str(ckpt)) == ckpt / "iter_0000000"  # trainer's own lookup
    opened = open_checkpoint(ckpt)
    assert opened.weights_only and opened.train_state["iteration"] == 0
    assert opened.train_state["source"]["model_type"] == "eurobert"
    mc = opened.model_config
    assert (mc.rotary_base, mc.norm_epsilon, mc.seq_length) == (50000.0, 1e-6, 128)
    assert (mc.num_query_groups, mc.padded_vocab_size) == (2, 512)
    assert signature_of(load_preset(ckpt / "model_preset.yaml")) == signature_of(mc)
    assert Path(opened.run_config.data.tokenizer) == ckpt / "tokenizer"
    # the megatron layout itself: a TP=1 embedding with zero padding rows, stacked layers
    weights = DistCheckpointWeights(ckpt / "iter_0000000" / "dist", mc.num_layers)
    embedding = weights["embedding.word_embeddings.weight"]
    src = hf_state(source_dir)
    assert torch.equal(embedding[:400], src["model.embed_tokens.weight"])
    assert not embedding[400:].any()
    qkv = weights["decoder.layers.1.self_attention.linear_qkv.weight"]
    q = src["model.layers.1.self_attn.q_proj.weight"]
    assert torch.equal(qkv[:32], q[:32])  # group 0: its two query heads first, then k, v
    assert torch.equal(qkv[32:48], src["model.layers.1.self_attn.k_proj.weight"][:16])


def test_bf16_round_trip_keeps_dtype_and_bits(tokenizer_dir, tmp_path):
    src = write_random_eurobert(tmp_path / "src", vocab_size=400, tokenizer_dir=tokenizer_dir,
                                seed=2, dtype=torch.bfloat16)
    from_hf(src, tmp_path / "ckpt", progress=False)
    summary = to_hf(tmp_path / "ckpt", tmp_path / "back", progress=False)
    assert summary.dtype == "bfloat16"
    before, after = hf_state(src), hf_state(tmp_path / "back")
    assert all(after[k].dtype == torch.bfloat16 and torch.equal(after[k], v) for k, v in before.items())
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"


def test_foreign_eurobert_without_tokenizer(tokenizer_dir, tmp_path):
    """A EuroBERT that was never ours: other sizes, ids and rope base, no tokenizer files."""
    src = write_random_eurobert(tmp_path / "src", vocab_size=300, seed=3, rope_theta=250000.0,
                                hidden_size=48, num_attention_heads=6, num_key_value_heads=3,
                                intermediate_size=80, mask_token_id=299, pad_token_id=1)
    summary = from_hf(src, tmp_path / "ckpt", progress=False)
    assert any("has no tokenizer" in note for note in summary.notes)
    with pytest.raises(TokenizerMismatch, match="names no tokenizer"):
        to_hf(tmp_path / "ckpt", tmp_path / "back", progress=False)
    # our 400-token tokenizer does not fit a 300-row embedding
    with pytest.raises(TokenizerMismatch, match="has 400 tokens but the model's vocabulary is 300"):
        to_hf(tmp_path / "ckpt", tmp_path / "back", tokenizer=str(tokenizer_dir), progress=False)
    assert not (tmp_path / "back").exists()


def test_export_refuses_a_tokenizer_other_than_the_runs(corpus_jsonl, imported, tmp_path):
    ckpt, _ = imported
    other = train_tokenizer(corpus_jsonl, tmp_path / "other_tok", vocab=350)
    with pytest.raises(TokenizerMismatch, match="is not the tokenizer the model was trained with.*350 tokens "
                                                "instead of 400"):
        to_hf(ckpt, tmp_path / "hf", tokenizer=str(other), progress=False)
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.partial-*"))


def _cli(capsys, *argv) -> tuple[int, str]:
    code = cli_main(list(argv) + ["--quiet"])
    return code, capsys.readouterr().err


def test_export_refuses_missing_truncated_and_corrupt_shards(imported, tmp_path, capsys):
    ckpt, _ = imported
    for damage in ("missing", "truncated", "flipped"):
        copy = tmp_path / damage
        shutil.copytree(ckpt, copy)
        shard = max((copy / "iter_0000000" / "dist").glob("*.distcp"), key=lambda p: p.stat().st_size)
        data = bytearray(shard.read_bytes())
        if damage == "missing":
            shard.unlink()
        elif damage == "truncated":
            shard.write_bytes(data[:-100])
        else:  # same size, so the manifest cannot see it: 16 bytes of tensor data inverted
            middle = len(data) // 2
            data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
            shard.write_bytes(bytes(data))
        code, err = _cli(capsys, "to-hf", "--checkpoint", str(copy), "--output", str(tmp_path / f"hf_{damage}"))
        assert code == 1, err
        expected = {"missing": f"file dist/{shard.name} is missing", "truncated": f"file dist/{shard.name} has",
                    "flipped": f"{shard.name}, the stored bytes of "}[damage]
        assert expected in err, err
        assert ("CRC-32" in err) if damage == "flipped" else ("earlier complete checkpoint" in err)
        assert not (tmp_path / f"hf_{damage}").exists()


def test_dist_reader_refuses_a_config_that_does_not_describe_the_checkpoint(imported):
    ckpt, _ = imported
    with pytest.raises(DistCheckpointReadError, match="stacks 2 layers but the run config says num_layers=3"):
        DistCheckpointWeights(ckpt / "iter_0000000" / "dist", 3)
    with pytest.raises(DistCheckpointReadError, match="not a torch_dist checkpoint"):
        DistCheckpointWeights(ckpt / "iter_0000000", 2)


def test_import_refuses_missing_and_corrupt_hf_shards(source_dir, tmp_path, capsys):
    from megatron_biglm.export import save_safetensors_stream

    sharded = tmp_path / "sharded"
    shutil.copytree(source_dir, sharded)
    (sharded / "model.safetensors").unlink()
    save_safetensors_stream(sharded, hf_state(source_dir).items(), max_shard_bytes=60_000)
    shards = sorted(sharded.glob("model-*.safetensors"))
    assert len(shards) > 2
    missing = tmp_path / "missing"
    shutil.copytree(sharded, missing)
    (missing / shards[1].name).unlink()
    code, err = _cli(capsys, "from-hf", "--hf", str(missing), "--output", str(tmp_path / "m_out"))
    assert code == 1 and f"missing: ['{shards[1].name}']" in err, err
    corrupt = tmp_path / "corrupt"
    shutil.copytree(sharded, corrupt)
    victim = corrupt / shards[0].name
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    code, err = _cli(capsys, "from-hf", "--hf", str(corrupt), "--output", str(tmp_path / "c_out"))
    assert code == 1 and shards[0].name in err and "corrupt" in err, err
    assert not (tmp_path / "m_out").exists() and not (tmp_path / "c_out").exists()


def test_import_refuses_unsupported_architectures(source_dir, tmp_path, capsys):
    from transformers import BertConfig, BertForMaskedLM

    BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=40)).save_pretrained(str(tmp_path / "bert"))
    code, err = _cli(capsys, "from-hf", "--hf", str(tmp_path / "bert"), "--output", str(tmp_path / "o1"))
    assert code == 1 and "model_type 'bert' is not supported" in err, err
    cases = {
        "mlp_bias": ({"mlp_bias": True}, "mlp_bias=True is not supported"),
        "head_dim": ({"head_dim": 8}, "head_dim=8 is not supported with hidden_size=64"),
        "gelu": ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    }
    for name, (change, message) in cases.items():
        variant = tmp_path / name
        shutil.copytree(source_dir, variant)
        config = json.loads((variant / "config.json").read_text())
        (variant / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UnsupportedArchitecture, match=message.replace("(", r"\(")):
            from_hf(variant, tmp_path / f"{name}_out", progress=False)
    with pytest.raises(ConversionError, match="cannot import at TP=3"):
        from_hf(source_dir, tmp_path / "tp3", tp=3, progress=False)


def test_import_refuses_a_tokenizer_that_contradicts_the_config(source_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(source_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "mask_token_id": 7}))
    with pytest.raises(TokenizerMismatch, match="mask_token_id=7 but the tokenizer's mask token has id 3"):
        from_hf(bad, tmp_path / "out", progress=False)


def test_outputs_must_be_new_directories(source_dir, imported, tmp_path):
    ckpt, _ = imported
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("keep me")
    with pytest.raises(ConversionError, match="exists and is not empty"):
        to_hf(ckpt, tmp_path / "busy", progress=False)
    with pytest.raises(ConversionError, match="exists and is not empty"):
        from_hf(source_dir, tmp_path / "busy", progress=False)
    with pytest.raises(ConversionError, match="overlaps the source"):
        to_hf(ckpt, ckpt / "iter_0000000" / "hf", progress=False)
    assert (tmp_path / "busy" / "notes.txt").read_text() == "keep me"
    with pytest.raises(CheckpointFileError, match="not a directory"):
        from_hf(tmp_path / "nowhere", tmp_path / "x", progress=False)
    with pytest.raises(CheckpointError, match="does not exist"):
        to_hf(tmp_path / "nowhere", tmp_path / "y", progress=False)


def test_max_abs_difference_matches_a_direct_computation_blockwise():
    from megatron_biglm.export.conversion_summary import max_abs_difference

    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        shape = tuple(int(d) for d in torch.randint(1, 40, (1 + trial % 3,), generator=gen))
        a = torch.randn(shape, generator=gen)
        b = a + torch.randn(shape, generator=gen) * 10 ** -float(trial % 7)
        for dtype in (torch.float32, torch.bfloat16):
            want = float((a.to(dtype).double() - b.double()).abs().max())
            for chunk in (1, 7, 1 << 22):
                assert max_abs_difference(a.to(dtype), b, chunk_elements=chunk) == want
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert max_abs_difference(x, x.clone()) == 0.0
    assert max_abs_difference(x, torch.tensor([1.0, 2.0, 3.0])) == float("inf")
    assert max_abs_difference(torch.tensor(2.0), torch.tensor(2.5)) == 0.5


def test_shard_sizes_parse():
    import argparse

    from megatron_biglm.cli.convert import parse_size

    assert parse_size("2GiB") == 2 * 2**30 and parse_size("500MB") == 500 * 10**6
    assert parse_size("100000") == 100000 and parse_size("1.5 kib") == 1536
    for bad in ("2 parsecs", "-1GB", "", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_size(bad)


def test_untied_eurobert_imports_exports_bit_identically_with_the_hf_logits(tokenizer_dir, tmp_path):
    """Public EuroBERT checkpoints have an lm_head of their own: import keeps it as megatron's
    `output_layer.weight` (untie_embeddings_and_output_weights), the model projects with it,
    and export writes it back as lm_head.weight with tie_word_embeddings false."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from megatron_biglm.inference.loading import load_megatron_checkpoint

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    src = write_random_eurobert(tmp_path / "src", vocab_size=vocab, tokenizer_dir=tokenizer_dir, seed=5,
                                tie_word_embeddings=False)
    before = hf_state(src)
    assert not torch.equal(before["lm_head.weight"], before["model.embed_tokens.weight"])
    summary = from_hf(src, tmp_path / "ckpt", progress=False)
    assert summary.max_abs_diff == 0.0 and summary.tensors == 15
    loaded = load_megatron_checkpoint(tmp_path / "ckpt")
    assert loaded.checkpoint.model_config.untie_embeddings_and_output_weights
    assert torch.equal(loaded.model.output_layer.weight[:vocab], before["lm_head.weight"])
    ids, _ = fixed_batch(vocab)
    hf = AutoModelForMaskedLM.from_pretrained(str(src), attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits
        ours = loaded.model(ids, split=None, runtime_gather_output=True)[..., :vocab]
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    to_hf(tmp_path / "ckpt", tmp_path / "back", progress=False)
    after = hf_state(tmp_path / "back")
    assert sorted(after) == sorted(before)
    for name, tensor in before.items():
        assert torch.equal(after[name], tensor), name
    assert json.loads((tmp_path / "back" / "config.json").read_text())["tie_word_embeddings"] is False
