"""Refuse a tokenizer that does not belong to the model being converted.

Why strict: a wrong tokenizer shipped next to correct weights gives a model that loads, runs
and silently predicts garbage (every id means another word). What can be checked is checked:
ids must fit the embedding, the mask token must exist (and be the one the config names), and
a tokenizer given in place of the run's own must equal it (same vocabulary and special ids)
whenever the run's tokenizer is still on disk.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from .tokenizer import load_tokenizer, tokenizer_digest

SPECIAL_ROLES = ("mask", "pad", "bos", "eos")


class TokenizerMismatch(ValueError):
    """The tokenizer does not fit the model; the message says how and what to pass instead."""


def special_ids(tokenizer) -> dict:
    return {role: getattr(tokenizer, f"{role}_token_id", None) for role in SPECIAL_ROLES}


def tokenizer_difference(expected, given) -> str | None:
    """A short description of how `given` differs from `expected`, or None if they are equal."""
    problems = []
    if len(expected) != len(given):
        problems.append(f"{len(given)} tokens instead of {len(expected)}")
    a, b = special_ids(expected), special_ids(given)
    for role in SPECIAL_ROLES:
        if a[role] != b[role]:
            problems.append(f"{role} id {b[role]} instead of {a[role]}")
    va, vb = expected.get_vocab(), given.get_vocab()
    moved = sum(1 for token, idx in va.items() if vb.get(token) != idx)
    if moved:
        problems.append(f"{moved} of {len(va)} tokens missing or at other ids")
    return "; ".join(problems) or None


def check_fits_vocab(tokenizer, vocab_size: int, where: str) -> List[str]:
    """Refuse ids outside the embedding or a missing mask token; return notes worth reporting."""
    if len(tokenizer) > vocab_size:
        raise TokenizerMismatch(
            f"{where}: the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
            f"{vocab_size}: it is not the tokenizer this model was trained with. Pass the right one")
    if tokenizer.mask_token_id is None:
        raise TokenizerMismatch(f"{where}: the tokenizer has no mask token; BiGLM is a masked LM and "
                                "needs the tokenizer it was trained with (which has one)")
    notes = []
    if len(tokenizer) < vocab_size:
        notes.append(f"the tokenizer has {len(tokenizer)} tokens; embedding rows "
                     f"{len(tokenizer)}..{vocab_size - 1} are never produced by it")
    return notes


def check_trained_digest(directory, trained_digest: str | None, what: str) -> None:
    """Refuse a tokenizer directory whose files differ from the digest the run saved
    (`data.tokenizer_sha256`): edited or replaced since the model was trained."""
    if trained_digest and Path(directory).expanduser().is_dir() and tokenizer_digest(directory) != trained_digest:
        raise TokenizerMismatch(f"{what} {directory} is not the tokenizer the model was trained with: its files "
                                "changed since (their SHA-256 differs from data.tokenizer_sha256 saved with the "
                                "checkpoint); point at the tokenizer the model was trained with")


def checkpoint_tokenizer(directory, *, vocab_size: int, trained_digest: str | None, trained_path: str | None,
                         checkpoint, what: str = "data.tokenizer") -> None:
    """Refuse a tokenizer given in place of a checkpoint's own (`what`, a directory) before the
    model is built: its SHA-256 (`tokenizer_digest`) must equal the one the checkpoint recorded
    (`trained_digest`, `data.tokenizer_sha256`), and its ids must fit the checkpoint's
    `vocab_size` embedding rows. The message names both tokenizers and how to use the right one
    (leave `what` unset: the checkpoint's own)."""
    path = Path(str(directory)).expanduser()
    trained = f"{trained_path}" if trained_path else "the tokenizer it was trained with"
    if trained_digest and path.is_dir():
        digest = tokenizer_digest(path)
        if digest != trained_digest:
            raise TokenizerMismatch(
                f"{what}={directory} is not the tokenizer {checkpoint} was trained with ({trained}): its SHA-256 is "
                f"{digest[:12]}..., the checkpoint recorded {trained_digest[:12]}...; leave {what} unset to use the "
                "checkpoint's own, or point it at a copy of that tokenizer")
    if path.is_dir():
        size = len(load_tokenizer(str(path)))
        if size > vocab_size:
            raise TokenizerMismatch(
                f"{what}={directory} has {size} tokens but {checkpoint} has {vocab_size} embedding rows (trained "
                f"with {trained}): ids past {vocab_size - 1} would index no row; leave {what} unset to use the "
                "checkpoint's own")


def load_export_tokenizer(vocab_size: int, run_tokenizer: str | None,
                          override: str | None, trained_digest: str | None = None) -> Tuple[object, str, List[str]]:
    """(tokenizer, its source, notes) to ship with an export.

    Loaded with `megatron_biglm.data.tokenizer.load_tokenizer`, exactly as training loaded it,
    so added special tokens get the same ids. `trained_digest`: the run's saved
    `data.tokenizer_sha256`; the run's own tokenizer must still match it.
    """
    source = override or run_tokenizer
    if not source:
        raise TokenizerMismatch("the run config names no tokenizer (data.tokenizer is empty); pass "
                                "--tokenizer DIR, the tokenizer the model was trained with")
    if not Path(source).expanduser().exists():
        raise TokenizerMismatch(
            f"tokenizer {source} does not exist" + ("" if override else
            " (data.tokenizer of the saved run config); pass --tokenizer DIR, the tokenizer the "
            "model was trained with"))
    if not override:
        check_trained_digest(source, trained_digest, "data.tokenizer of the saved run config,")
    if override and trained_digest and Path(override).expanduser().is_dir():
        digest = tokenizer_digest(override)
        if digest != trained_digest:
            raise TokenizerMismatch(
                f"--tokenizer {override} is not the tokenizer the model was trained with"
                + (f" ({run_tokenizer})" if run_tokenizer else "") + f": its SHA-256 is {digest[:12]}..., the "
                f"checkpoint recorded {trained_digest[:12]}... (data.tokenizer_sha256). Drop --tokenizer to use "
                "the run's own, or pass a copy of it")
    tokenizer = load_tokenizer(str(Path(source).expanduser()))
    notes = check_fits_vocab(tokenizer, vocab_size, f"tokenizer {source}")
    if override and run_tokenizer and Path(run_tokenizer).expanduser().exists() \
            and Path(run_tokenizer).expanduser().resolve() != Path(override).expanduser().resolve():
        trained = load_tokenizer(str(Path(run_tokenizer).expanduser()))
        difference = tokenizer_difference(trained, tokenizer)
        if difference:
            raise TokenizerMismatch(
                f"--tokenizer {override} is not the tokenizer the model was trained with "
                f"({run_tokenizer}): {difference}. Drop --tokenizer to ship the run's own")
        notes.append(f"--tokenizer {override} equals the run's tokenizer {run_tokenizer}")
    elif override and run_tokenizer and not Path(run_tokenizer).expanduser().exists():
        notes.append(f"the run's tokenizer {run_tokenizer} is gone, so --tokenizer {override} "
                     "was checked against the vocabulary size only")
    return tokenizer, source, notes


def check_import_tokenizer(tokenizer, hf_config, where: str) -> List[str]:
    """An HF directory's own tokenizer must fit its config (vocabulary and mask id)."""
    notes = check_fits_vocab(tokenizer, hf_config.vocab_size, where)
    for role in SPECIAL_ROLES:
        configured = getattr(hf_config, f"{role}_token_id", None)
        actual = getattr(tokenizer, f"{role}_token_id", None)
        if configured is None or configured == actual:
            continue
        if role == "mask":
            raise TokenizerMismatch(
                f"{where}: config.json says mask_token_id={configured} but the tokenizer's mask "
                f"token has id {actual}: the tokenizer and the weights come from different models")
        notes.append(f"config.json {role}_token_id={configured}, tokenizer has {actual}")
    return notes
