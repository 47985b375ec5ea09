"""The lm-eval `LM` for masked language models, over any `MaskedLMAdapter`.

lm-eval has no masked-LM backend: its `loglikelihood(context, continuation)` assumes a causal
model. Here each request becomes `[BOS] + context + slots(continuation) (+ tail)` and a scoring
rule (see `scoring/`) turns masked predictions into a log-likelihood. Tokenization follows the
reference code and lm-eval's causal models: trailing spaces of the context move to the
continuation, the pair is encoded whole and split at the context's token count. Contexts that
do not fit are truncated from the left and counted (`get_model_info()["masked_lm_eval"]`).
"""
from __future__ import annotations

import logging
from typing import Any

from lm_eval.api.model import LM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm.auto import tqdm

from megatron_biglm.generation import MaskPredictGenerator
from megatron_biglm.inference.protocol import MaskedLMAdapter

from .generation_kwargs import generation_config_from_kwargs
from .runner import score_requests
from .scoring import ScoreRequest, make_rule

log = logging.getLogger(__name__)

class MaskedLMEvalLM(LM):
    """lm-eval model for a masked LM.

    scoring: beam | oneshot | pll | l2r | elbo (see `scoring/__init__.py` for costs);
    elbo_samples, seed: Monte-Carlo draws per request of the elbo rule and their seed;
    beam: beam width of the beam rule; batch_size: rows per forward pass;
    prefix_reuse: auto | on | off (reuse context keys/values across choices and rounds);
    add_eos: close every input with EOS after the continuation slots (off in the reference)."""

    def __init__(self, adapter: MaskedLMAdapter, tokenizer, *, scoring: str = "beam", beam: int = 1,
                 batch_size: int = 16, prefix_reuse: str = "auto", add_eos: bool = False,
                 progress: bool = True, elbo_samples: int = 128, seed: int = 0):
        super().__init__()
        self.adapter = adapter
        self.tokenizer = tokenizer
        self.rule = make_rule(str(scoring), adapter.special.mask_id, int(beam),
                              samples=int(elbo_samples), seed=int(seed))
        self.batch_size = int(batch_size)
        self.prefix_reuse = _resolve_prefix_reuse(str(prefix_reuse), adapter)
        if add_eos and adapter.special.eos_id is None:
            raise ValueError("add_eos=True but the tokenizer has no EOS/SEP token")
        self.tail: tuple[int, ...] = (adapter.special.eos_id,) if add_eos else ()
        self.progress = bool(progress)
        self.truncated_contexts = 0
        self.scored_requests = 0
        self.forward_passes = 0
        self.generated_requests = 0
        self.capped_generations = 0
        self._generator = None

    @property
    def device(self):
        return self.adapter.device

    # ---------------------------------------------------------------- tokenization
    def tok_encode(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        if not context:
            return [], self.tok_encode(continuation)
        whole = self.tok_encode(context + continuation)
        context_ids = self.tok_encode(context)
        return context_ids, whole[len(context_ids):]

    def build_request(self, context_ids: list[int], continuation_ids: list[int]) -> ScoreRequest:
        """`[BOS] + context` as prefix; the context is cut from the left to fit max_length."""
        budget = self.adapter.max_length - 1 - len(self.tail)
        if len(continuation_ids) > budget:
            raise ValueError(
                f"a continuation of {len(continuation_ids)} tokens does not fit the model's "
                f"max_length {self.adapter.max_length} (with BOS{' and EOS' if self.tail else ''}); "
                "use a model with longer positions or a task with shorter answers")
        keep = budget - len(continuation_ids)
        if len(context_ids) > keep:
            self.truncated_contexts += 1
            context_ids = context_ids[len(context_ids) - keep:]
        return ScoreRequest((self.adapter.special.bos_id, *context_ids), tuple(continuation_ids),
                            self.tail)

    # ---------------------------------------------------------------- lm-eval API
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        built = [self.build_request(*self.encode_pair(*req.args)) for req in requests]
        results = self._score(built, disable_tqdm)
        out = [(r.logprob, r.is_greedy) for r in results]
        for req, answer in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Whole-string log-likelihood in disjoint windows (lm-eval's rolling scheme), each
        window scored by the selected rule with `[BOS] + window context` as prefix."""
        # lm-eval's windows: context + predicted = window + 1 tokens after make_disjoint_window,
        # and we add BOS (and the tail) around them
        window = self.adapter.max_length - 2 - len(self.tail)
        if window < 1:
            raise ValueError(f"max_length {self.adapter.max_length} leaves no room for rolling windows")
        built, owner = [], []
        for k, req in enumerate(requests):
            (text,) = req.args[:1]
            tokens = self.tok_encode(text)
            pairs = get_rolling_token_windows(tokens, self.adapter.special.bos_id, window, 1)
            for w, (context_ids, predicted) in enumerate(map(make_disjoint_window, pairs)):
                if w == 0:
                    context_ids = []  # lm-eval's placeholder context is [BOS]: our prefix already
                built.append(self.build_request(context_ids, predicted))
                owner.append(k)
        totals = [0.0] * len(requests)
        for k, result in zip(owner, self._score(built, disable_tqdm)):
            totals[k] += result.logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Mask-Predict continuations of each context (`megatron_biglm.generation`), with the
        request's generation kwargs mapped by `generation_kwargs.py` (an unknown kwarg is an
        error). Requests with the same kwargs are generated together, in batches."""

        if self._generator is None:
            self._generator = MaskPredictGenerator(self.adapter, self.tokenizer,
                                                   use_cache=self.prefix_reuse)
        groups: dict[str, list[int]] = {}
        configs = {}
        for k, req in enumerate(requests):
            gen_kwargs = req.args[1] if len(req.args) > 1 else {}
            config, capped = generation_config_from_kwargs(gen_kwargs or {},
                                                           max_length=self.adapter.max_length)
            key = repr(config)
            configs[key] = config
            groups.setdefault(key, []).append(k)
            self.capped_generations += int(capped)
        out: list[str] = [""] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm or not self.progress,
                   desc="generate_until (mask-predict)")
        for key, members in groups.items():
            contexts = [requests[k].args[0] for k in members]
            start = bar.n
            results = self._generator.generate(
                contexts, configs[key], batch_size=self.batch_size,
                progress=lambda done, total, start=start: bar.update(start + done - bar.n))
            for k, result in zip(members, results):
                out[k] = result.text
                self.truncated_contexts += int(result.prompt_tokens_dropped > 0)
                self.cache_hook.add_partial("generate_until", requests[k].args, result.text)
        bar.close()
        self.generated_requests += len(requests)
        if self.capped_generations:
            log.warning("%d generation requests asked for more tokens than the model's %d positions "
                        "hold; max_gen_toks was capped", self.capped_generations, self.adapter.max_length)
        return out

    def get_model_info(self) -> dict[str, Any]:
        """Merged by lm-eval into `results["config"]`: how the masked LM was scored."""
        return {"masked_lm_eval": {
            "scoring": self.rule.name, "beam": getattr(self.rule, "beam", None),
            "prefix_reuse": self.prefix_reuse, "add_eos": bool(self.tail),
            "batch_size": self.batch_size, "scored_requests": self.scored_requests,
            "forward_passes": self.forward_passes,
            "truncated_contexts": self.truncated_contexts,
            "generated_requests": self.generated_requests,
            "capped_generations": self.capped_generations, **self.adapter.describe()}}

    def _score(self, built: list[ScoreRequest], disable_tqdm: bool):
        results = score_requests(self.adapter, built, self.rule, batch_size=self.batch_size,
                                 prefix_reuse=self.prefix_reuse,
                                 progress=self.progress and not disable_tqdm)
        self.scored_requests += len(results)
        self.forward_passes += sum(r.passes for r in results)
        if self.truncated_contexts:
            log.warning("%d contexts so far were truncated from the left to fit max_length %d",
                        self.truncated_contexts, self.adapter.max_length)
        return results


def _resolve_prefix_reuse(wanted: str, adapter: MaskedLMAdapter) -> bool:
    possible = adapter.prefix_cache and adapter.split_attention
    if wanted == "auto":
        return possible
    if wanted == "on":
        if not possible:
            raise ValueError("prefix_reuse=on but this model cannot reuse prefixes "
                             f"({adapter.describe()}); use prefix_reuse=auto or off")
        return True
    if wanted == "off":
        return False
    raise ValueError(f"prefix_reuse must be auto, on or off, got {wanted!r}")
