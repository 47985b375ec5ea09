"""Tokenizer training and loading: our BPE reloads offline and round-trips real text; any HF
tokenizer directory gets the special tokens BiGLM needs, with a message for each addition."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from preprocess_fixtures import bpe, bpe_dir, corpus_texts, load_tool  # noqa: F401 (fixtures)


def test_trained_tokenizer_reloads_offline_and_round_trips(bpe_dir, corpus_texts):
    from transformers import AutoTokenizer

    config = json.loads((bpe_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # also loads in transformers 4
    tokenizer = AutoTokenizer.from_pretrained(str(bpe_dir))  # HF_HUB_OFFLINE=1 (conftest)
    assert len(tokenizer) == 1000
    assert [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id,
            tokenizer.mask_token_id, tokenizer.unk_token_id] == [0, 1, 2, 3, 4]
    assert [tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token,
            tokenizer.mask_token] == ["<s>", "</s>", "<pad>", "<mask>"]
    for text in corpus_texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert max(ids) < 1000 and min(ids) > 4  # text never yields a special token
        assert tokenizer.decode(ids) == text  # byte-level: lossless
        with_specials = tokenizer(text)["input_ids"]
        assert with_specials == [0] + ids + [1]  # the RoBERTa-style template
    # the sample has real merges: well under one token per character
    total_chars = sum(map(len, corpus_texts))
    total_tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in corpus_texts)
    assert total_tokens < 0.5 * total_chars
    assert tokenizer.convert_tokens_to_ids("<mask>") == 3
    masked = tokenizer("To be <mask> not", add_special_tokens=False)["input_ids"]
    assert masked.count(3) == 1


def test_cli_custom_special_token_names(corpus_jsonl, tmp_path, capsys):
    from transformers import AutoTokenizer

    tool = load_tool("train_tokenizer")
    out = tmp_path / "tok"
    rc = tool.main(["--input", str(corpus_jsonl), "--vocab-size", "600", "--output", str(out),
                    "--bos-token", "[BOS]", "--mask-token", "[MASK]"])
    assert rc == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["special_ids"] == {"bos": 0, "eos": 1, "pad": 2, "mask": 3, "unk": 4}
    assert report["vocab_size"] == 600 and report["skipped"] == {}
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert (tokenizer.bos_token, tokenizer.mask_token, tokenizer.eos_token) == ("[BOS]", "[MASK]", "</s>")


def test_cli_vocab_too_small_is_a_usage_error(corpus_jsonl, tmp_path, capsys):
    tool = load_tool("train_tokenizer")
    rc = tool.main(["--input", str(corpus_jsonl), "--vocab-size", "200", "--output", str(tmp_path)])
    assert rc == 2
    assert "leaves no room for merges" in capsys.readouterr().err


def _save_bpe_without_mask(corpus_texts, directory, **special):
    """A real BPE saved as an HF tokenizer dir with only the given special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(special.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(corpus_texts[:10], trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=backend, **special).save_pretrained(str(directory))
    return directory


def test_directory_without_mask_gets_one_with_a_message(corpus_texts, tmp_path, caplog):
    from transformers import AutoTokenizer

    from megatron_biglm.data.tokenizer import load_tokenizer

    directory = _save_bpe_without_mask(corpus_texts, tmp_path, bos_token="<s>", eos_token="</s>")
    before = AutoTokenizer.from_pretrained(str(directory))
    assert before.mask_token is None and before.pad_token is None
    with caplog.at_level(logging.WARNING, logger="megatron_biglm.data.tokenizer"):
        tokenizer = load_tokenizer(directory)
    assert tokenizer.mask_token == "<mask>"
    assert tokenizer.mask_token_id == len(before) and len(tokenizer) == len(before) + 1
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == before.eos_token_id
    assert tokenizer.bos_token_id == before.bos_token_id
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "added mask '<mask>'" in messages and "pad := eos" in messages
    ids = tokenizer("thou <mask> art", add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.mask_token_id) == 1
    # the other ids are unchanged by the addition
    assert tokenizer("thou art", add_special_tokens=False)["input_ids"] == \
        before("thou art", add_special_tokens=False)["input_ids"]


def test_no_mask_added_when_disabled_and_bare_tokenizer_gains_eos(corpus_texts, tmp_path, caplog):
    from megatron_biglm.data.tokenizer import load_tokenizer

    directory = _save_bpe_without_mask(corpus_texts, tmp_path)  # no special tokens at all
    with caplog.at_level(logging.WARNING, logger="megatron_biglm.data.tokenizer"):
        tokenizer = load_tokenizer(directory, add_mask_token=False)
    assert tokenizer.mask_token is None
    assert tokenizer.eos_token == "</s>" and tokenizer.eos_token_id == 400
    assert tokenizer.bos_token_id == tokenizer.pad_token_id == 400
    assert "no mask token and add_mask_token=False" in caplog.text


def test_bert_style_directory_maps_cls_and_sep(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from megatron_biglm.data.tokenizer import load_tokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "to", "be", "or", "not"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                            cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
                            ).save_pretrained(str(tmp_path))
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (2, 3)
    assert (tokenizer.pad_token_id, tokenizer.mask_token_id, len(tokenizer)) == (0, 4, 9)


def test_loading_errors_say_what_to_do(tmp_path):
    from megatron_biglm.data.tokenizer import TokenizerLoadError, load_tokenizer

    with pytest.raises(TokenizerLoadError, match="hub"):
        load_tokenizer("no-such-org/no-such-tokenizer")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        load_tokenizer(tmp_path / "empty")


def test_dtype_for_vocab_matches_megatron():
    from megatron.core.datasets.indexed_dataset import DType

    from megatron_biglm.data.tokenizer import dtype_for_vocab

    sizes = [1, 255, 1000, 32000, 49152, 65499, 65500, 65535, 65536, 128256, 256000]
    sizes += list(np.random.default_rng(0).integers(1, 300_000, size=200))
    for size in sizes:
        assert dtype_for_vocab(int(size)) is DType.optimal_dtype(int(size)), size
    with pytest.raises(ValueError):
        dtype_for_vocab(0)


def test_a_tokenizer_in_place_of_a_checkpoints_own_is_checked_by_digest_and_embedding_rows(tokenizer_dir, tmp_path):
    """`checkpoint_tokenizer`: the recorded SHA-256 and the embedding rows, both named in the refusal."""
    import shutil

    from megatron_biglm.data.tokenizer import load_tokenizer, tokenizer_digest
    from megatron_biglm.data.tokenizer_check import TokenizerMismatch, checkpoint_tokenizer

    digest, size = tokenizer_digest(tokenizer_dir), len(load_tokenizer(str(tokenizer_dir)))
    copy = tmp_path / "copy"
    shutil.copytree(tokenizer_dir, copy)
    checkpoint_tokenizer(copy, vocab_size=size, trained_digest=digest, trained_path=str(tokenizer_dir), checkpoint="ckpt")
    with pytest.raises(TokenizerMismatch, match=rf"data\.tokenizer={copy} is not the tokenizer ckpt was trained with "
                                                rf"\(/trained/tok\): its SHA-256 is {digest[:12]}\.\.\., the checkpoint "
                                                r"recorded 000000000000\.\.\.; leave data\.tokenizer unset"):
        checkpoint_tokenizer(copy, vocab_size=size, trained_digest="0" * 64, trained_path="/trained/tok",
                             checkpoint="ckpt")
    with pytest.raises(TokenizerMismatch, match=rf"data\.tokenizer={copy} has {size} tokens but ckpt has {size - 100} "
                                                rf"embedding rows \(trained with /trained/tok\): ids past {size - 101}"):
        checkpoint_tokenizer(copy, vocab_size=size - 100, trained_digest=None, trained_path="/trained/tok",
                             checkpoint="ckpt")
