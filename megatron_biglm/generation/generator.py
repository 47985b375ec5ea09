"""`MaskPredictGenerator`: prompts in, `GenerationOutput`s out.

It owns what is about text and batching: tokenizing prompts into the model input
`[BOS] + prompt ids + N slots` (the layout of the scoring rules), fitting them to the model's
positions, batching prompts with padding, seeding each candidate's random draws, choosing the
length-beam winner, the EOS and `until` cuts, and decoding ids back to text. The decoding itself
is `blocks.decode_candidates` over the adapter (duck-typed: see `slot_forward`). Every prompt's
ids are checked against the ids the model embeds first (`prompt_ids.py`).

Seeds: each candidate draws from its own generator, seeded from (config.seed, the prompt's ids,
how many identical prompts came before it in the call, the candidate length). So a prompt's
draws do not depend on which other prompts share its batch, and repeated prompts in one call
still get different samples.
"""
from __future__ import annotations

import hashlib
import math
from typing import Callable, Sequence

import torch

from megatron_biglm.inference.loading import load_adapter
from megatron_biglm.inference.protocol import BlockCausalLogits, LengthPrediction, MaskedLMAdapter

from .blocks import Candidate, decode_candidates
from .config import GenerationConfig, GenerationConfigError
from .length import LengthPredictor, best, candidate_lengths, lengths_around, mean_logprob
from .output import CanvasStep, GenerationOutput
from .prompt_ids import PromptIdRange


class MaskPredictGenerator:
    """Mask-Predict generation with a masked-LM adapter and its tokenizer.

    `length_predictor` (see `length.LengthPredictor`) defaults to the adapter's `predict_lengths`
    when it has the `LengthPrediction` capability (a checkpoint with a length head).
    `use_cache` defaults to the adapter's `prefix_cache`; False forces full forwards (the
    reference path)."""

    def __init__(self, adapter: MaskedLMAdapter, tokenizer, *, length_predictor: LengthPredictor | None = None,
                 use_cache: bool | None = None):
        mask = getattr(tokenizer, "mask_token_id", None)
        if mask is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no mask token; Mask-Predict "
                             "starts from masked slots, so set tokenizer.mask_token to the model's "
                             "mask token (e.g. '<mask>' or '[MASK]')")
        if int(mask) != int(adapter.special.mask_id):
            raise ValueError(f"the tokenizer's mask id {mask} differs from the model's "
                             f"{adapter.special.mask_id}; load the tokenizer saved with the model")
        if adapter.special.bos_id is None:
            raise ValueError("the model's special tokens have no BOS id; the model input is "
                             "[BOS] + prompt + slots, so set the tokenizer's bos_token (or cls_token)")
        self.adapter = adapter
        self.tokenizer = tokenizer
        self.prompt_ids = PromptIdRange.of(adapter, tokenizer)  # ids are checked before any forward
        if length_predictor is None and isinstance(adapter, LengthPrediction):
            length_predictor = adapter.predict_lengths
        self.length_predictor = length_predictor
        self.use_cache = bool(adapter.prefix_cache) if use_cache is None else bool(use_cache)

    @classmethod
    def from_pretrained(cls, path, *, device: str | None = None, dtype: str | None = None,
                        use_cache: bool | None = None, **load_options) -> "MaskPredictGenerator":
        """An HF export directory or a megatron checkpoint (root, `iter_*`, run directory),
        loaded by the one inference loader (`inference.loading.load_adapter`), so generation
        runs the model exactly as lm-eval scores it. `dtype` None: bfloat16 on GPU, float32 on
        CPU. `load_options`: tokenizer, split_attention, prefix_cache, max_length,
        trust_remote_code, length_buckets, verify, cache_layout; anything else is an error."""
        loaded = load_adapter(path, device=device, dtype=dtype, **load_options)
        return cls(loaded.adapter, loaded.tokenizer, use_cache=use_cache)

    # ------------------------------------------------------------------ public
    def generate(self, prompts: Sequence[str], config: GenerationConfig | None = None, *,
                 batch_size: int = 8, progress: Callable[[int, int], None] | None = None,
                 **options) -> list[GenerationOutput]:
        """One output per prompt, in order. `options` override fields of `config`;
        `progress(done, total)` is called after every batch of prompts."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a list of strings; wrap a single prompt in a list")
        config = self._checked_config(config, batch_size, options)
        encoded = [self._encode(i, p) for i, p in enumerate(prompts)]
        return self._run(list(prompts), encoded, config, batch_size, progress)

    def generate_ids(self, prompt_ids: Sequence[Sequence[int]], config: GenerationConfig | None = None, *,
                     batch_size: int = 8, progress: Callable[[int, int], None] | None = None,
                     **options) -> list[GenerationOutput]:
        """`generate` for prompts already tokenized (ids without BOS), e.g. a fine-tuning
        set's encoded sources: no text round trip, so the model sees exactly the ids it was
        trained on. Each output's `prompt` is the decoded ids."""
        config = self._checked_config(config, batch_size, options)
        encoded = [[int(x) for x in ids] for ids in prompt_ids]
        for i, ids in enumerate(encoded):
            if not ids:
                raise ValueError(f"prompt {i} has no ids; the model input is [BOS] + prompt + slots")
            self.prompt_ids.check(i, ids)
        texts = [self.tokenizer.decode(ids, skip_special_tokens=False) for ids in encoded]
        return self._run(texts, encoded, config, batch_size, progress)

    def _checked_config(self, config: GenerationConfig | None, batch_size: int, options) -> GenerationConfig:
        config = config or GenerationConfig()
        if options:
            config = config.replace(**options)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        config.check_length_source(self.length_predictor is not None)
        if (config.blocks == "cached" and config.block_size is not None and not self.use_cache
                and not isinstance(self.adapter, BlockCausalLogits)):
            raise GenerationConfigError(
                f"blocks='cached' (block-causal) without the prefix cache needs the "
                f"BlockCausalLogits capability, which {type(self.adapter).__name__} lacks; use the "
                "prefix cache or blocks='refresh'")
        return config

    @torch.no_grad()  # decoding needs no gradients; with them every iteration would chain
    # through the stored confidences and hold all activations until the output is returned
    def _run(self, prompts: list[str], encoded: list[list[int]], config: GenerationConfig,
             batch_size: int, progress) -> list[GenerationOutput]:
        seen: dict[tuple[int, ...], int] = {}
        occurrence = []
        for ids in encoded:
            occurrence.append(seen.get(tuple(ids), 0))
            seen[tuple(ids)] = occurrence[-1] + 1
        step = 1 if config.batch_invariant else batch_size
        outputs: list[GenerationOutput] = []
        for start in range(0, len(prompts), step):
            stop = min(start + step, len(prompts))
            outputs += self._generate_batch(list(prompts[start:stop]), encoded[start:stop],
                                            occurrence[start:stop], config)
            if progress is not None:
                progress(stop, len(prompts))
        return outputs

    # ------------------------------------------------------------------ steps
    def _encode(self, index: int, prompt: str) -> list[int]:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt {index} is a {type(prompt).__name__}, not a string")
        ids = list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else []
        if not ids:
            raise ValueError(f"prompt {index} is empty (no tokens); give every prompt some text "
                             "(the model input is [BOS] + prompt + slots)")
        self.prompt_ids.check(index, ids, self.tokenizer)
        return ids

    def _generate_batch(self, prompts, encoded, occurrence, config) -> list[GenerationOutput]:
        special = self.adapter.special
        bos = int(special.bos_id)
        if config.length is not None:
            need = max(lengths_around(config.length, config.length_beam))
        else:  # a predictor's lengths are known only after it has seen the (fitted) prefix
            need = 1 if self.length_predictor is not None else config.max_new_tokens
        fitted = [self._fit(ids, need, config) for ids in encoded]
        prefixes = [[bos] + ids for ids, _ in fitted]
        lengths = candidate_lengths(config, prefixes, self.length_predictor, int(special.pad_id),
                                    self.adapter.device)
        refit = [self._fit(ids, max(cands), config) for (ids, _), cands in zip(fitted, lengths)]
        dropped = [d0 + d1 for (_, d0), (_, d1) in zip(fitted, refit)]
        prefixes = [[bos] + ids for ids, _ in refit]
        random = config.temperature > 0 or config.remask == "random"
        groups = []
        for prefix, ids, occ, cands in zip(prefixes, encoded, occurrence, lengths):
            groups.append([Candidate(prefix, n, self.candidate_generator(config.seed, ids, occ, n) if random else None,
                                     length_logprob=logp) for n, logp in cands.items()])
        decode_candidates(self.adapter, [c for g in groups for c in g], config, self.use_cache)
        return [self.output_of(prompt, group, drop, config)
                for prompt, group, drop in zip(prompts, groups, dropped)]

    def _fit(self, ids: list[int], slots: int, config) -> tuple[list[int], int]:
        """`ids` (the prompt without BOS) shortened from the left so that 1 + len + slots fits."""
        room = int(self.adapter.max_length) - 1 - slots
        if len(ids) <= room:
            return ids, 0
        if room < 1:
            raise ValueError(f"{slots} slots do not fit the model's {self.adapter.max_length} positions "
                             "with [BOS] and one prompt token; ask for fewer tokens")
        if config.overflow == "error":
            raise ValueError(f"[BOS] + {len(ids)} prompt tokens + {slots} slots exceed the model's "
                             f"{self.adapter.max_length} positions; shorten the prompt, ask for fewer "
                             "tokens, or pass overflow='truncate_left' to drop prompt tokens from the left")
        return ids[len(ids) - room:], len(ids) - room

    def candidate_generator(self, seed: int, ids: list[int], occurrence: int, length: int) -> torch.Generator:
        """The random stream of one candidate: seeded from (seed, occurrence, length, prompt ids)
        only, so its draws do not depend on what else is decoded beside it."""
        key = f"{seed}|{occurrence}|{length}|{','.join(map(str, ids))}".encode()
        gen = torch.Generator(device=self.adapter.device)
        gen.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little") & ((1 << 63) - 1))
        return gen

    def output_of(self, prompt: str, group: list[Candidate], dropped: int,
                  config: GenerationConfig) -> GenerationOutput:
        """The output of one prompt: the length beam's winner among `group`, cut at EOS and
        `until`, decoded to text."""
        eos = self.adapter.special.eos_id
        kept, scores = [], []
        for c in group:
            n = len(c.tokens)
            if config.eos_cut and eos is not None and eos in c.tokens:
                n = c.tokens.index(eos)
            kept.append(n)
            scores.append(mean_logprob(c.logconf[:n + 1] if n < len(c.tokens) else c.logconf) + c.length_logprob)
        win = best(scores)
        c, n = group[win], kept[win]
        ids, logconf = c.tokens[:n], c.logconf[:n]
        reason = "eos" if n < len(c.tokens) else "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        cut = min((i for i in (text.find(s) for s in config.until) if i >= 0), default=-1)
        if cut >= 0:
            text, reason = text[:cut], "stop"
            k = 0
            while k < len(ids) and text.startswith(self.tokenizer.decode(ids[:k + 1], skip_special_tokens=True)):
                k += 1
            ids, logconf = ids[:k], logconf[:k]
        steps = [CanvasStep(b, t, tuple(s)) for b, t, s in c.canvases] if config.return_steps else None
        return GenerationOutput(
            prompt=prompt, text=text, ids=ids, confidence=[math.exp(x) for x in logconf],
            iterations=c.iterations, finish_reason=reason, length=c.n_slots,
            candidates=[(g.n_slots, s) for g, s in zip(group, scores)], steps=steps,
            prompt_tokens_dropped=dropped)
