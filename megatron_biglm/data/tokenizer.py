"""Tokenizers for every stage: train our byte-level BPE, or load any local HF tokenizer.

BiGLM needs four ids that decoder tokenizers often lack: `mask` (the objective's [MASK]),
`pad`, `bos` and `eos` (the scoring and generation layouts start with [BOS] and end with
[EOS]). `load_tokenizer` is the one entry point every stage uses, so every stage sees the
same ids; it fills gaps the same way each time and logs each change, because a silently
grown vocabulary changes the embedding size.

transformers is imported lazily: tokenizer workers and `import megatron_biglm.data` stay light.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from megatron_biglm.common.file_content import sha256_file
from megatron_biglm.data.readers import SkipReport, iter_texts

logger = logging.getLogger(__name__)

#: role -> token text of the tokenizers we train. Ids follow this order (0..4).
DEFAULT_SPECIAL_TOKENS: dict[str, str] = {
    "bos": "<s>", "eos": "</s>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>"}

#: Megatron's cut-off: token ids fit in uint16 only below this vocabulary size.
UINT16_VOCAB_LIMIT = 65500


def dtype_for_vocab(vocab_size: int):
    """The numpy dtype Megatron uses for token ids: uint16 below 65,500 entries, else int32.
    (Same rule as `megatron.core.datasets.indexed_dataset.DType.optimal_dtype`, without
    importing megatron.)"""
    if vocab_size is None or int(vocab_size) <= 0:
        raise ValueError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    return np.uint16 if int(vocab_size) < UINT16_VOCAB_LIMIT else np.int32


class TokenizerLoadError(RuntimeError):
    """A tokenizer could not be loaded; the message says what was tried and what to do."""


def load_tokenizer(name_or_dir, *, add_mask_token: bool = True):
    """Load a fast HF tokenizer and guarantee `bos`, `eos`, `pad` (and `mask`) ids exist.

    `name_or_dir` is a directory (ours from `train_bpe_tokenizer`, or any local HF tokenizer
    such as SmolLM's or Llama's), a hub name (only where a hub is reachable), or an already
    loaded tokenizer (returned after the same checks). What is missing is filled, each fill
    logged at WARNING:
      * bos: the `cls` token if there is one (BERT), else eos; eos: `sep`, else a new `</s>`;
        so a tokenizer with none of these gains `</s>` and uses it for both.
      * pad: eos (the usual choice for decoder tokenizers: no new embedding row).
      * mask: a new `<mask>` token (it must never occur in text, so nothing can be reused);
        skipped with a warning when `add_mask_token=False`.
    """
    tokenizer = name_or_dir if not isinstance(name_or_dir, (str, os.PathLike)) else _from_pretrained(name_or_dir)
    if not hasattr(tokenizer, "backend_tokenizer"):
        raise TokenizerLoadError(
            f"{name_or_dir!r} loaded as {type(tokenizer).__name__}, which is not a fast (Rust) "
            "tokenizer; convert it with `tokenizers` or save it with tokenizer.json")
    _ensure_special_tokens(tokenizer, add_mask_token=add_mask_token)
    return tokenizer


def tokenizer_digest(directory) -> str:
    """SHA-256 over a tokenizer directory's files (names and bytes, in name order; the .json,
    .txt and .model files a tokenizer is made of, not a README beside them): what identifies
    the tokenizer a checkpoint was trained with, wherever the directory is."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).expanduser().iterdir()
                       if p.is_file() and p.suffix in (".json", ".txt", ".model")):
        digest.update(path.name.encode() + b"\0")
        digest.update(bytes.fromhex(sha256_file(path)))
    return digest.hexdigest()


#: what a tokenizer on the HF hub is named: `org/name`
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_name(text: str) -> bool:
    """True for `org/name` that is no local path: the only tokenizer value looked up on the
    HF hub. Anything else (`tok`, `runs/x/tokenizer`, `./tok`) is a directory, and a missing
    one is an error at once, not a minute of hub retries."""
    text = str(text)
    return bool(_HUB_NAME.match(text)) and not Path(text).expanduser().exists()


def _from_pretrained(name_or_dir):
    from transformers import AutoTokenizer  # lazy: start-up (transformers: 0.7 CPU s)

    where = str(name_or_dir)
    path = Path(where).expanduser()
    if path.exists() and not path.is_dir():
        raise TokenizerLoadError(f"{where} is a file; give the directory that holds tokenizer.json")
    if not path.exists() and not looks_like_hub_name(where):
        raise TokenizerLoadError(f"tokenizer {where!r}: no such directory (working directory {os.getcwd()}); "
                                 "it is not looked up on the HF hub, whose names look like org/name. Pass a directory "
                                 "that holds tokenizer.json")
    try:
        return AutoTokenizer.from_pretrained(str(path) if path.is_dir() else where, use_fast=True)
    except (OSError, ValueError) as exc:
        hint = ("it is a local directory, so it must hold tokenizer.json (or a tokenizer model "
                "transformers can convert) and tokenizer_config.json" if path.is_dir() else
                "it is not a local directory, so it was looked up on the HF hub; offline "
                "(HF_HUB_OFFLINE=1) only names already in the HF cache load. Pass a directory")
        raise TokenizerLoadError(f"could not load tokenizer {where!r}: {exc}\n  ({hint})") from exc


def _ensure_special_tokens(tokenizer, *, add_mask_token: bool) -> list[str]:
    """Fill missing bos/eos/pad/mask as documented in `load_tokenizer`; return what changed."""
    changes: list[str] = []
    new_tokens: dict[str, str] = {}
    if tokenizer.eos_token is None:
        if tokenizer.sep_token is not None:
            tokenizer.eos_token = tokenizer.sep_token
            changes.append(f"eos := sep {tokenizer.sep_token!r}")
        else:
            new_tokens["eos_token"] = DEFAULT_SPECIAL_TOKENS["eos"]
            changes.append(f"added eos {DEFAULT_SPECIAL_TOKENS['eos']!r}")
    if new_tokens:
        tokenizer.add_special_tokens(new_tokens)
        new_tokens = {}
    if tokenizer.bos_token is None:
        source = "cls" if tokenizer.cls_token is not None else "eos"
        tokenizer.bos_token = getattr(tokenizer, f"{source}_token")
        changes.append(f"bos := {source} {tokenizer.bos_token!r}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        changes.append(f"pad := eos {tokenizer.eos_token!r}")
    if tokenizer.mask_token is None:
        if add_mask_token:
            token = _unused_token(tokenizer, DEFAULT_SPECIAL_TOKENS["mask"])
            tokenizer.add_special_tokens({"mask_token": token})
            changes.append(f"added mask {token!r} (id {tokenizer.mask_token_id}); "
                           f"vocabulary is now {len(tokenizer)}")
        else:
            logger.warning("tokenizer %s has no mask token and add_mask_token=False: "
                           "masked-LM stages will fail", tokenizer.name_or_path)
    for change in changes:
        logger.warning("tokenizer %s: %s", tokenizer.name_or_path or "<in memory>", change)
    return changes


def _unused_token(tokenizer, wanted: str) -> str:
    """`wanted`, or `wanted` with a suffix if it already tokenizes to a regular word."""
    vocab = tokenizer.get_vocab()
    token, n = wanted, 0
    while token in vocab and token not in tokenizer.all_special_tokens:
        n += 1
        token = f"{wanted[:-1]}_{n}>"
    return token


def train_bpe_tokenizer(files, vocab_size: int, output_dir, *, json_keys: Sequence[str] = ("text",),
                        special_tokens: Mapping[str, str] | None = None, min_frequency: int = 2,
                        text_mode: str = "block", report=None) -> Path:
    """Train a byte-level BPE on every document of text/jsonl/parquet `files` (paths or
    globs) and save it; see `train_bpe_tokenizer_on_texts`. Bad input lines are counted in
    `report` (a `readers.SkipReport`, created if not given) and logged, never fatal unless
    strict."""
    report = report if report is not None else SkipReport()
    texts = iter_texts(files, json_keys=json_keys, report=report, text_mode=text_mode)
    return train_bpe_tokenizer_on_texts(
        texts, vocab_size, output_dir, special_tokens=special_tokens, min_frequency=min_frequency,
        empty_hint=lambda: f"no training text in {list(files)}: {report.summary_line()}")


def train_bpe_tokenizer_on_texts(texts: Iterable[str], vocab_size: int, output_dir, *,
                                 special_tokens: Mapping[str, str] | None = None,
                                 min_frequency: int = 2, empty_hint=None) -> Path:
    """Train a byte-level BPE on `texts` (e.g. a `text_sample` draw) and save it so that
    `AutoTokenizer.from_pretrained(output_dir)` loads it offline.

    Byte-level: every string encodes (no <unk>) and decodes back exactly. `special_tokens`
    maps role (bos, eos, pad, mask, unk) to token text; they take ids 0..4 in that order.
    `tokenizer(text)` adds `<s> ... </s>` (RoBERTa layout, used by fine-tuning); the
    preprocessing tool encodes without them. No text at all is a ValueError whose message
    is `empty_hint()` when given.
    """
    from transformers import PreTrainedTokenizerFast  # lazy: start-up (transformers: 0.7 CPU s)

    roles = dict(DEFAULT_SPECIAL_TOKENS)
    if special_tokens:
        unknown = set(special_tokens) - set(roles)
        if unknown:
            raise ValueError(f"unknown special-token roles {sorted(unknown)}; use {sorted(roles)}")
        roles.update(special_tokens)
    names = list(roles.values())
    if len(set(names)) != len(names):
        raise ValueError(f"special tokens must be distinct, got {roles}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size <= len(alphabet) + len(names):
        raise ValueError(f"vocab_size {vocab_size} leaves no room for merges: a byte-level BPE "
                         f"needs more than {len(alphabet)} bytes + {len(names)} special tokens")

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=names, initial_alphabet=alphabet,
                                  show_progress=False)
    counted = _Counted(texts)
    backend.train_from_iterator(counted, trainer=trainer)
    if counted.n == 0:
        raise ValueError(empty_hint() if empty_hint else "no training text")
    bos, eos = roles["bos"], roles["eos"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B:1 {eos}:1",
        special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=bos, eos_token=eos, pad_token=roles["pad"],
        mask_token=roles["mask"], unk_token=roles["unk"], clean_up_tokenization_spaces=False)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(output_dir))
    _portable_tokenizer_class(output_dir / "tokenizer_config.json")
    logger.info("trained byte-level BPE: %d entries from %d texts -> %s",
                backend.get_vocab_size(), counted.n, output_dir)
    return output_dir


def _portable_tokenizer_class(config_path: Path) -> None:
    """transformers 5 records `tokenizer_class: TokenizersBackend`, a name 4.x cannot load;
    `PreTrainedTokenizerFast` names the same class in 5.x and loads in 4.x too."""
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") == "TokenizersBackend":
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                               encoding="utf-8")


class _Counted:
    """Iterator wrapper counting the texts the trainer consumed (to reject empty inputs)."""

    def __init__(self, items: Iterable[str]):
        self._items, self.n = iter(items), 0

    def __iter__(self):
        return self

    def __next__(self) -> str:
        item = next(self._items)
        self.n += 1
        return item
