"""Test doubles for the generation tests: a scripted masked LM, a character tokenizer, and a
loop-by-loop Mask-Predict reference.

`ScriptedAdapter` follows the inference adapter protocol by duck typing. Its logits at a slot are
a fixed pseudo-random function of (prefix tokens, suffix tokens as input, slot index), so they
depend on everything a model's would, and its "prefix cache" is exact by construction (the state
is the prefix tokens). It records every call, so tests can check what the decoder asked for.
"""
from __future__ import annotations

import hashlib
import math
from types import SimpleNamespace

import torch

PAD, BOS, EOS, MASK = 0, 1, 2, 3
FIRST_CHAR = 5
SPECIAL = SimpleNamespace(bos_id=BOS, mask_id=MASK, pad_id=PAD, eos_id=EOS)


class ScriptedAdapter:
    """`eos_at`: absolute position (in `[BOS] + prompt + slots`) where EOS gets a large logit,
    to exercise the EOS cut;
    `allow_specials=False` makes special tokens (ids < FIRST_CHAR) all but impossible."""

    length_buckets = None

    def __init__(self, vocab: int = 32, *, prefix_cache: bool = True, max_length: int = 64,
                 eos_at: int | None = None, allow_specials: bool = True, salt: str = ""):
        self.vocab, self.prefix_cache, self.max_length = vocab, prefix_cache, max_length
        self.embedding_rows = vocab
        self.special = SPECIAL
        self.split_attention = True
        self.eos_at, self.allow_specials, self.salt = eos_at, allow_specials, salt
        self.calls: list[tuple] = []

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def slot_logits(self, prefix, suffix, j) -> torch.Tensor:
        key = f"{self.salt}|{tuple(prefix)}|{tuple(suffix)}|{j}".encode()
        gen = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") >> 1)
        out = 2.5 * torch.randn(self.vocab, generator=gen, dtype=torch.float64)
        if not self.allow_specials:
            out[:FIRST_CHAR] = -50.0
        if self.eos_at is not None and len(prefix) + j == self.eos_at:
            out[EOS] = 30.0
        return out

    def _rows(self, prefixes, suffixes, positions):
        out = torch.zeros(len(prefixes), positions.shape[1], self.vocab, dtype=torch.float64)
        for r, (prefix, suffix) in enumerate(zip(prefixes, suffixes)):
            for k, j in enumerate(positions[r].tolist()):
                if 0 <= j < len(suffix):
                    out[r, k] = self.slot_logits(prefix, suffix, j)
        return out

    def logits(self, input_ids, lengths, split, positions):
        ids = input_ids.tolist()
        prefixes = [row[:int(s)] for row, s in zip(ids, split)]
        suffixes = [row[int(s):int(n)] for row, s, n in zip(ids, split, lengths)]
        self.calls.append(("logits", [tuple(s) for s in suffixes]))
        return self._rows(prefixes, suffixes, positions - split[:, None])

    def encode_prefix(self, prefix_ids, prefix_lengths):
        self.calls.append(("encode_prefix", len(prefix_lengths)))
        return [tuple(row[:int(n)]) for row, n in zip(prefix_ids.tolist(), prefix_lengths)]

    def logits_with_prefix(self, state, rows, suffix_ids, suffix_lengths, positions):
        prefixes = [state[r] for r in rows.tolist()]
        suffixes = [row[:int(n)] for row, n in zip(suffix_ids.tolist(), suffix_lengths)]
        self.calls.append(("logits_with_prefix", [tuple(s) for s in suffixes]))
        return self._rows(prefixes, suffixes, positions)

    def extend_prefix(self, state, rows, block_ids, block_lengths):
        blocks = [tuple(row[:int(n)]) for row, n in zip(block_ids.tolist(), block_lengths)]
        self.calls.append(("extend_prefix", rows.tolist(), blocks))
        return [state[r] + b for r, b in zip(rows.tolist(), blocks)]

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


class CharTokenizer:
    """Ids FIRST_CHAR.. map to the characters of `alphabet`; ids below are specials."""

    def __init__(self, vocab: int, alphabet: str = "abcdefghijklmnopqrstuvwxyz0123456789 .,",
                 mask: bool = True):
        self.alphabet = alphabet[:vocab - FIRST_CHAR]
        self.mask_token_id = MASK if mask else None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [FIRST_CHAR + self.alphabet.index(ch) for ch in text]}

    def decode(self, ids, skip_special_tokens=False):
        names = {PAD: "<pad>", BOS: "<s>", EOS: "</s>", MASK: "<mask>", 4: "<unk>"}
        return "".join(self.alphabet[i - FIRST_CHAR] if i >= FIRST_CHAR
                       else ("" if skip_special_tokens else names[i]) for i in ids)


def reference_mask_predict(adapter, prefix, n, steps, remask="low_confidence", threshold=None):
    """Greedy Mask-Predict for one row with explicit loops: returns (tokens, logprobs, canvases,
    iterations). Canvases hold MASK at masked slots after every iteration. `adapter` is anything
    with `slot_logits(prefix, suffix, j)` (logits or log-probs of slot j, one unpadded row)."""
    tokens, logp, masked = [MASK] * n, [0.0] * n, [True] * n
    canvases = []
    for t in range(1, steps + 1):
        if not any(masked):
            break
        suffix = [MASK if m else tok for tok, m in zip(tokens, masked)]
        before = list(masked)
        for j in range(n):
            if masked[j]:
                logits = adapter.slot_logits(prefix, suffix, j).clone()
                logits[MASK] = -math.inf
                lp = torch.log_softmax(logits, dim=-1)
                tokens[j] = int(lp.argmax())
                logp[j] = float(lp[tokens[j]])
        keep_masked = n * (steps - t) // steps
        eligible = [j for j in range(n) if (before[j] if remask == "none" else True)
                    and (threshold is None or logp[j] < math.log(threshold))]
        chosen = set(sorted(eligible, key=lambda j: (logp[j], j))[:keep_masked])
        masked = [j in chosen for j in range(n)]
        canvases.append([MASK if m else tok for tok, m in zip(tokens, masked)])
    return tokens, logp, canvases, len(canvases)


class BruteForceModel:
    """`slot_logits` of an HF masked LM from one unpadded forward of `prefix + suffix` with the
    split mask built by loops (`eval_fixtures.bf_logprobs`): the reference for the decoder's
    batched, padded, cached path."""

    def __init__(self, model):
        self.model = model

    def slot_logits(self, prefix, suffix, j):
        from eval_fixtures import bf_logprobs

        return bf_logprobs(self.model, list(prefix) + list(suffix), len(prefix))[len(prefix) + j]


class BlockCausalReference:
    """An adapter over an HF masked LM whose "cache" is only the token segments: every call
    re-runs one unpadded forward per row with a loop-built block-causal mask (a key in segment
    b is visible to a query in segment a iff b <= a; the scored slots are the last segment).
    It is the uncached reference for `blocks="cached"`, which `logits` cannot express."""

    prefix_cache = True
    split_attention = True
    length_buckets = None

    def __init__(self, model, special=SPECIAL, max_length: int = 256):
        self.model, self.special, self.max_length = model, special, max_length
        self.embedding_rows = model.get_input_embeddings().num_embeddings

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def logits(self, input_ids, lengths, split, positions):
        raise AssertionError("the block-causal reference is only driven through its cache API")

    def encode_prefix(self, prefix_ids, prefix_lengths):
        return [[row[:int(n)]] for row, n in zip(prefix_ids.tolist(), prefix_lengths)]

    def extend_prefix(self, state, rows, block_ids, block_lengths):
        return [state[r] + [row[:int(n)]] for r, row, n in zip(rows.tolist(), block_ids.tolist(), block_lengths)]

    def logits_with_prefix(self, state, rows, suffix_ids, suffix_lengths, positions):
        out = []
        for r, row, n, pos in zip(rows.tolist(), suffix_ids.tolist(), suffix_lengths, positions.tolist()):
            segments = state[r] + [row[:int(n)]]
            seq = [tok for seg in segments for tok in seg]
            segment_of = [k for k, seg in enumerate(segments) for _ in seg]
            dtype = next(self.model.parameters()).dtype
            mask = torch.full((1, 1, len(seq), len(seq)), torch.finfo(dtype).min, dtype=dtype)
            for i in range(len(seq)):
                for j in range(len(seq)):
                    if segment_of[j] <= segment_of[i]:
                        mask[0, 0, i, j] = 0.0
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([seq]), attention_mask=mask).logits[0]
            start = len(seq) - int(n)
            out.append(logits[[min(start + p, len(seq) - 1) for p in pos]])
        return torch.stack(out)
