"""The token ids a prompt may hold: those the model has an embedding row for and the tokenizer
knows, `[0, min(embedding rows, len(tokenizer)))`.

An id outside them fails inside the forward: an IndexError on CPU, and on a GPU a device-side
assert that leaves the CUDA context unusable, so a server would fail every later request until
it is restarted. Ids reach a model two ways: given by the caller (the server's token-id
prompts, `MaskPredictGenerator.generate_ids`) and from text, since a tokenizer grown with
`add_tokens` without resizing the model's embedding tokenizes its added tokens to ids past the
model's rows. Both are checked here, before any forward, by the generator and by the server
(`serving.completions`): one check, one message.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from megatron_biglm.inference.protocol import MaskedLMAdapter


class BadTokenId(ValueError):
    """A prompt holds an id the model cannot embed; the message names the prompt, the id, its
    position and the valid range."""


@dataclass(frozen=True)
class PromptIdRange:
    """`embedding_rows` (the adapter's, None: unknown) and `tokenizer_ids` (`len(tokenizer)`,
    None for a tokenizer without a length); `limit` is the smaller of those known."""

    embedding_rows: int | None
    tokenizer_ids: int | None

    @classmethod
    def of(cls, adapter: MaskedLMAdapter, tokenizer) -> "PromptIdRange":
        rows = adapter.embedding_rows
        try:
            size = len(tokenizer)
        except TypeError:  # a tokenizer that does not say how many ids it has
            size = None
        return cls(None if rows is None else int(rows), size)

    @property
    def limit(self) -> int | None:
        known = [n for n in (self.embedding_rows, self.tokenizer_ids) if n is not None]
        return min(known) if known else None

    @property
    def unembedded(self) -> int:
        """How many of the tokenizer's ids the model has no embedding row for."""
        if self.embedding_rows is None or self.tokenizer_ids is None:
            return 0
        return max(0, self.tokenizer_ids - self.embedding_rows)

    def warning(self) -> str | None:
        """The one line to print when a model is loaded whose tokenizer outgrew its embedding."""
        if not self.unembedded:
            return None
        return (f"the tokenizer has {self.tokenizer_ids} ids but the model embeds {self.embedding_rows}: "
                f"ids {self.embedding_rows}..{self.tokenizer_ids - 1} ({self.unembedded}) have no "
                "embedding row (tokens added to the tokenizer without resizing the model); prompts "
                "holding them are refused. Resize the model's embedding and train it to use them")

    def check(self, index: int, ids: Sequence[int], tokenizer=None) -> None:
        """Raise BadTokenId for the first id of prompt `index` outside `[0, limit)`. With
        `tokenizer`, the ids came from the prompt's text (the message names the token)."""
        limit = self.limit
        for position, token in enumerate(ids):
            if 0 <= token and (limit is None or token < limit):
                continue
            where = (f"prompt {index} tokenizes to id {token} ({tokenizer.decode([token])!r}) at position "
                     f"{position}" if tokenizer is not None else
                     f"prompt {index} holds token id {token} at position {position}")
            raise BadTokenId(f"{where}, outside this model's token ids [0, {limit}){self._why(token)}; "
                             + ("remove that token from the text" if tokenizer is not None else
                                f"send only ids in [0, {limit}), as the model's tokenizer gives them"))

    def _why(self, token: int) -> str:
        if token < 0:
            return " (token ids are never negative)"
        if self.unembedded and self.embedding_rows <= token < self.tokenizer_ids:
            return (f" (the tokenizer has {self.tokenizer_ids} ids but the model has only "
                    f"{self.embedding_rows} embedding rows: tokens were added to the tokenizer "
                    "without resizing the model)")
        return ""
