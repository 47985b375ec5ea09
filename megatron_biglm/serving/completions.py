"""`/v1/completions` in terms of the generator and the scheduler: prompts to jobs, jobs to
OpenAI-shaped choices.

A prompt (text, or token ids as lm-eval sends them) becomes `[BOS] + ids + max_tokens slots`,
the generator's layout, refused when it does not fit the model's positions (no silent left
truncation: the message names both lengths) or holding an id the model does not embed (the
generator's check, `generation.prompt_ids`: the id, its position and the valid range). Each of
the `n` choices is a group of length candidates (`max_tokens, max_tokens - 1, ...` under a
length beam) whose random draws come from
`MaskPredictGenerator.candidate_generator(seed, ids, choice, length)`: the stream `biglm-generate`
uses for the same prompt and seed, independent of the batch.

`echo` + `logprobs` scores the prompt under the request's rule (`scoring.score_prompts`)
and puts its per-token terms before the generated tokens' log-confidences (lm-eval's
`local-completions` reads them with `max_tokens: 1`); `max_tokens: 0` is allowed only then.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from megatron_biglm.generation.blocks import Candidate
from megatron_biglm.generation.config import GenerationConfig, GenerationConfigError
from megatron_biglm.generation.generator import MaskPredictGenerator
from megatron_biglm.generation.output import GenerationOutput
from megatron_biglm.generation.prompt_ids import BadTokenId

from .scheduler import GenerationJob
from .schema import BadRequest, CompletionRequest


@dataclass
class PreparedPrompt:
    ids: list[int]
    text: str


class CompletionService:
    """Everything between a validated `CompletionRequest` and the scheduler, for one model."""

    def __init__(self, generator: MaskPredictGenerator, model_name: str, *, timeout_s: float,
                 block_modes: tuple[str, ...] = ("refresh",)):
        self.generator = generator
        self.block_modes = tuple(block_modes)  # the `blocks` values the scheduler's decoder serves
        self.adapter = generator.adapter
        self.tokenizer = generator.tokenizer
        self.model_name = model_name
        self.timeout_s = float(timeout_s)

    # ------------------------------------------------------------------ checks
    def prompts(self, req: CompletionRequest) -> list[PreparedPrompt]:
        if req.model != self.model_name:
            raise BadRequest(f"unknown model {req.model!r}; this server serves {self.model_name!r}",
                             "model")
        raw = req.prompt
        if isinstance(raw, str) or (raw and all(isinstance(x, int) for x in raw)):
            raw = [raw]
        if not raw:
            raise BadRequest("prompt is empty; give a string, a list of strings or token ids", "prompt")
        if req.stream and len(raw) > 1:
            raise BadRequest(f"stream sends one completion; send the {len(raw)} prompts as separate "
                             "requests", "stream")
        out = []
        for i, p in enumerate(raw):
            if isinstance(p, str):
                ids = list(self.tokenizer(p, add_special_tokens=False)["input_ids"]) if p else []
                text = p
            else:
                ids, text = list(p), None
            try:  # before any forward: an id without an embedding row breaks a CUDA context
                self.generator.prompt_ids.check(i, ids, self.tokenizer if text is not None else None)
            except BadTokenId as exc:
                raise BadRequest(str(exc), "prompt") from None
            if text is None:
                text = self.tokenizer.decode(ids, skip_special_tokens=False)
            if not ids:
                raise BadRequest(f"prompt {i} has no tokens; the model input is [BOS] + prompt + slots",
                                 "prompt")
            room = int(self.adapter.max_length)
            if 1 + len(ids) + req.max_tokens > room:
                raise BadRequest(f"prompt {i} is {len(ids)} tokens; with [BOS] and max_tokens="
                                 f"{req.max_tokens} that is {1 + len(ids) + req.max_tokens} positions, "
                                 f"more than the model's length {room}; shorten the prompt or ask "
                                 "for fewer tokens", "prompt")
            out.append(PreparedPrompt(ids, text))
        return out

    def config(self, req: CompletionRequest) -> GenerationConfig:
        scoring = req.echo and req.logprobs is not None
        if req.max_tokens == 0 and not scoring:
            raise BadRequest("max_tokens=0 generates nothing; it is allowed only with echo=true and "
                             "logprobs (scoring the prompt)", "max_tokens")
        if req.stream and req.logprobs is not None:
            raise BadRequest("logprobs are not streamed; leave stream off to get them", "logprobs")
        if req.stream and (req.n > 1 or req.length_beam > 1):
            raise BadRequest("stream sends one choice block by block; use n=1 and length_beam=1",
                             "stream")
        if req.context_tokens and not scoring:
            raise BadRequest("context_tokens applies to scoring (echo=true with logprobs)",
                             "context_tokens")
        if req.blocks not in self.block_modes:
            raise BadRequest(f"blocks={req.blocks!r} is not served for {self.model_name}: it keeps no "
                             f"keys/values between blocks (an HF export); use one of {list(self.block_modes)}",
                             "blocks")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        if any(s == "" for s in stop):
            raise BadRequest("stop holds an empty string, which would end every completion before its first "
                             "token; leave it out or give non-empty stop strings", "stop")
        top_p = None if req.temperature == 0 and req.top_p == 1.0 else req.top_p  # 1.0 keeps all
        try:
            return GenerationConfig(
                steps=req.steps, max_new_tokens=max(1, req.max_tokens), block_size=req.block_size,
                blocks=req.blocks,
                remask=req.remasking, temperature=req.temperature, top_p=top_p, seed=req.seed,
                until=tuple(stop))
        except GenerationConfigError as exc:
            raise BadRequest(str(exc)) from None

    # ------------------------------------------------------------------ jobs
    def job(self, prompt: PreparedPrompt, req: CompletionRequest, config: GenerationConfig,
            on_done, on_block=None) -> GenerationJob:
        bos = int(self.adapter.special.bos_id)
        lengths = [n for n in range(req.max_tokens, req.max_tokens - req.length_beam, -1) if n >= 1]
        random = config.temperature > 0 or config.remask == "random"
        groups = [[Candidate([bos] + prompt.ids, n, self.generator.candidate_generator(
            config.seed, prompt.ids, choice, n) if random else None) for n in lengths]
            for choice in range(req.n)]
        block = config.block_size or max(lengths)
        return GenerationJob(config, groups, block, time.monotonic() + self.timeout_s, on_done, on_block)

    def outputs(self, prompt: PreparedPrompt, job: GenerationJob) -> list[GenerationOutput]:
        return [self.generator.output_of(prompt.text, group, 0, job.config) for group in job.groups]

    # ------------------------------------------------------------------ responses
    def choice(self, index: int, prompt: PreparedPrompt, out: GenerationOutput | None,
               req: CompletionRequest, score=None) -> dict:
        gen_ids = [] if out is None or req.max_tokens == 0 else list(out.ids)
        text = "" if out is None or req.max_tokens == 0 else out.text
        choice = {"index": index, "text": (prompt.text if req.echo else "") + text,
                  "logprobs": None,
                  "finish_reason": "length" if out is None or out.finish_reason == "length" else "stop",
                  "token_ids": gen_ids}
        if req.logprobs is not None:
            choice["logprobs"] = self._logprobs(prompt, gen_ids, out, req, score)
        return choice

    def _logprobs(self, prompt, gen_ids, out, req, score) -> dict:
        tokens, values, tops = [], [], []
        if req.echo:
            tokens += list(prompt.ids)
            values += list(score.token_logprobs) if score is not None else [None] * len(prompt.ids)
            tops += [None if best is None else {self._piece(top): best}
                     for best, top in zip(score.top_logprobs, score.top_ids)] if score is not None \
                else [None] * len(prompt.ids)
        gen_lp = [math.log(c) if c > 0 else float("-inf") for c in (out.confidence if out else [])][:len(gen_ids)]
        tokens += gen_ids
        values += gen_lp
        tops += [{self._piece(t): lp} for t, lp in zip(gen_ids, gen_lp)]  # the chosen token only
        pieces = [self._piece(t) for t in tokens]
        offsets, at = [], 0
        for piece in pieces:
            offsets.append(at)
            at += len(piece)
        body = {"tokens": pieces, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
        if score is not None:
            body["score"] = {"rule": req.scoring, "logprob": score.logprob, "is_greedy": score.is_greedy,
                             "context_tokens": req.context_tokens}
        return body

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    def response(self, choices: list[dict], prompts: list[PreparedPrompt]) -> dict:
        prompt_tokens = sum(len(p.ids) for p in prompts)
        completion_tokens = sum(len(c["token_ids"]) for c in choices)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "created": int(time.time()), "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}
