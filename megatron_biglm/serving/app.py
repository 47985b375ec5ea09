"""The HTTP layer: a FastAPI app over one `CompletionService` and its `BlockScheduler`.

Endpoints (OpenAI's request and response shapes where OpenAI has them):
- `POST /v1/completions`: generation, `stream` as server-sent events (one per finished block),
  `echo` + `logprobs` scoring (see `completions.py` and `schema.py` for the fields);
- `POST /v1/chat/completions`: the same through an instruction-tuning chat template (`chat.py`);
- `POST /v1/embeddings` (`embeddings.py`);
- `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text, `metrics.py`);
- `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`: the server's tokenizer, as
  lm-eval's API models ask for it.

Errors have OpenAI's body `{"error": {"message", "type", "param", "code"}}`: 400 for a bad
request (the message and `param` name the field), 413 for a body past `--max-request-bytes`
(refused as it arrives, before it is parsed: `body_limit.py`), 429 with `Retry-After` when the queue is
full, 503 once the server is draining, 504 past the request timeout, 500 when the model fails
(the server keeps serving). A client that disconnects has its request dropped at the next block
boundary, freeing its rows. Parsing, validation and tokenization run in worker threads, off the
event loop, so `/health` and other requests are answered while a large request is checked.
"""
from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from megatron_biglm.evaluation.scoring import make_rule

from .body_limit import DEFAULT_MAX_REQUEST_BYTES, BodyLimit, BodyTooLarge
from .chat import ChatCompletionRequest, as_chat_response, chat_as_completion
from .completions import CompletionService
from .metrics import ServerMetrics
from .scheduler import BlockScheduler, Cancelled, QueueFull, RequestTimeout, ShuttingDown
from .schema import BadRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, TokenizeRequest, parse
from .scoring import score_prompts

RETRY_AFTER_S = 1
_DISCONNECT_POLL_S = 0.25


@dataclass
class ServerState:
    """Draining (after SIGTERM: new requests get 503) and the requests in flight."""

    draining: bool = False
    in_flight: int = 0


def _error(status: int, message: str, kind: str, param: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}},
                        status_code=status, headers=headers)


def error_response(exc: BaseException) -> JSONResponse:
    """The status and OpenAI-style body for an exception raised while answering."""
    if isinstance(exc, BadRequest):
        return _error(exc.status, exc.message, "invalid_request_error", exc.param)
    if isinstance(exc, BodyTooLarge):
        return _error(413, str(exc), "invalid_request_error")
    if isinstance(exc, QueueFull):
        return _error(429, f"{exc}; retry after {RETRY_AFTER_S} s", "rate_limit_error",
                      headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, ShuttingDown):
        return _error(503, "the server is shutting down and takes no new requests", "unavailable")
    if isinstance(exc, RequestTimeout):
        return _error(504, str(exc), "timeout")
    if isinstance(exc, Cancelled):  # nobody reads it: nginx's "client closed request"
        return _error(499, str(exc), "cancelled")
    return _error(500, f"the model failed on this request: {type(exc).__name__}: {exc}", "server_error")


class _Gate:
    """ASGI middleware: refuses requests with 503 while draining, counts those in flight, and
    records each answered request's status and latency."""

    def __init__(self, app, state: ServerState, metrics: ServerMetrics):
        self.app, self.state, self.metrics = app, state, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, start = scope["path"], time.monotonic()
        if self.state.draining:
            response = error_response(ShuttingDown())
            await response(scope, receive, send)
            self.metrics.request_done(path, 503, time.monotonic() - start)
            return
        status = [500]

        async def send_status(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.state.in_flight += 1
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.state.in_flight -= 1
            self.metrics.request_done(path, status[0], time.monotonic() - start)


def build_app(service: CompletionService, scheduler: BlockScheduler, metrics: ServerMetrics,
              state: ServerState, *, embedder=None, chat_template=None,
              score_batch_size: int = 16, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """The app; `embedder` (`embeddings.Embedder`, None for a model that does not embed)
    answers `/v1/embeddings`, `chat_template` (a `ChatTemplate`, None: no chat)
    `/v1/chat/completions`; a body past `max_request_bytes` gets 413."""
    app = FastAPI(title="biglm-serve", docs_url=None, redoc_url=None, openapi_url=None)
    tokenizer = service.tokenizer

    async def _answer(_request, exc):
        return error_response(exc)

    # the expected refusals are answered quietly; anything else (a model failure) also logs
    for kind in (BadRequest, BodyTooLarge, QueueFull, ShuttingDown, RequestTimeout, Cancelled, Exception):
        app.add_exception_handler(kind, _answer)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": service.model_name}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_name, "object": "model",
                                            "created": 0, "owned_by": "megatron-biglm",
                                            "max_model_len": int(service.adapter.max_length)}]}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return {"eos_token": tokenizer.eos_token, "bos_token": tokenizer.bos_token,
                "pad_token": tokenizer.pad_token, "mask_token": tokenizer.mask_token,
                "model_max_length": int(service.adapter.max_length),
                "chat_template": getattr(tokenizer, "chat_template", None)}

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await run_in_threadpool(parse, TokenizeRequest, await request.body())
        ids = await run_in_threadpool(
            lambda: list(tokenizer(req.prompt, add_special_tokens=req.add_special_tokens)["input_ids"]))
        return {"tokens": ids, "count": len(ids), "max_model_len": int(service.adapter.max_length)}

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await run_in_threadpool(parse, DetokenizeRequest, await request.body())
        return {"prompt": await run_in_threadpool(_decode, req.tokens)}

    def _decode(ids: list[int]) -> str:
        size = len(tokenizer)
        for position, token in enumerate(ids):
            if not 0 <= token < size:
                raise BadRequest(f"tokens holds id {token} at position {position}, outside this tokenizer's "
                                 f"ids [0, {size})", "tokens")
        return tokenizer.decode(ids, skip_special_tokens=False)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        req = await run_in_threadpool(parse, EmbeddingRequest, await request.body())
        if req.model != service.model_name:
            raise BadRequest(f"unknown model {req.model!r}; this server serves {service.model_name!r}",
                             "model")
        if embedder is None:
            raise BadRequest(f"{service.model_name} does not embed: serve a sentence-transformers "
                             "export (biglm-export to-st) or a megatron checkpoint", "model")
        texts = [req.input] if isinstance(req.input, str) else list(req.input)
        if not texts or any(not t for t in texts):
            raise BadRequest("input needs one or more non-empty strings", "input")
        if req.input_type is not None and req.input_type not in embedder.prompts:
            raise BadRequest(f"input_type {req.input_type!r} is not one of this model's prompts "
                             f"{sorted(embedder.prompts)}", "input_type")
        counts = await run_in_threadpool(embedder.token_counts, texts, req.input_type)
        longest = max(range(len(texts)), key=counts.__getitem__)
        if counts[longest] > embedder.max_length and not req.truncate:
            raise BadRequest(f"input {longest} is {counts[longest]} tokens (its prompt and special tokens "
                             f"included), more than the {embedder.max_length} this model embeds; shorten it, "
                             f"or set truncate: true to embed its first {embedder.max_length} tokens", "input")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        scheduler.submit_call(lambda: embedder.embed(texts, req.input_type),
                              lambda result, error: loop.call_soon_threadsafe(_settle, future, result, error),
                              time.monotonic() + service.timeout_s)
        vectors = (await _until_done_or_gone(request, [future]))[0]
        if req.dimensions is not None and req.dimensions != vectors.shape[1]:
            raise BadRequest(f"dimensions={req.dimensions}, but this model's vectors have "
                             f"{vectors.shape[1]}; leave dimensions out", "dimensions")
        data = [{"object": "embedding", "index": i,
                 "embedding": _encode_vector(v, req.encoding_format)} for i, v in enumerate(vectors)]
        tokens = sum(min(n, embedder.max_length) for n in counts)
        return {"object": "list", "data": data, "model": service.model_name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await run_in_threadpool(parse, CompletionRequest, await request.body())
        return await _complete(request, req, "text_completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        if chat_template is None:
            raise BadRequest(f"{service.model_name} is served without a chat template; restart "
                             "biglm-serve with --chat-template for an instruction-tuned model", "model")
        req = await run_in_threadpool(parse, ChatCompletionRequest, await request.body())
        answer = await _complete(request, await run_in_threadpool(chat_as_completion, req, chat_template),
                                 "chat.completion")
        return answer if isinstance(answer, StreamingResponse) else as_chat_response(answer)

    async def _complete(request: Request, req: CompletionRequest, kind: str):
        prompts = await run_in_threadpool(service.prompts, req)
        config = service.config(req)
        loop = asyncio.get_running_loop()
        if req.stream:
            return StreamingResponse(_stream(req, prompts[0], config, loop, kind),
                                     media_type="text/event-stream")
        jobs, waits = [], []
        try:
            if req.echo and req.logprobs is not None:
                waits.append(_score(req, prompts, loop))
            if req.max_tokens > 0:
                for prompt in prompts:
                    future = loop.create_future()
                    job = service.job(prompt, req, config, _resolver(loop, future))
                    scheduler.submit(job)
                    jobs.append(job)
                    waits.append(future)
            results = await _until_done_or_gone(request, waits)
        except BaseException:
            for job in jobs:
                job.cancel()
            raise
        scores = results.pop(0) if req.echo and req.logprobs is not None else [None] * len(prompts)
        choices = []
        for p, prompt in enumerate(prompts):
            outs = service.outputs(prompt, results[p]) if req.max_tokens > 0 else [None] * req.n
            choices += [service.choice(p * req.n + j, prompt, out, req, scores[p])
                        for j, out in enumerate(outs)]
        return service.response(choices, prompts)

    def _score(req, prompts, loop) -> asyncio.Future:
        future = loop.create_future()
        rule = make_rule(req.scoring, int(service.adapter.special.mask_id), req.beam)
        for i, p in enumerate(prompts):
            if req.context_tokens >= len(p.ids):
                raise BadRequest(f"context_tokens={req.context_tokens} leaves nothing to score in "
                                 f"prompt {i} of {len(p.ids)} tokens", "context_tokens")
        scheduler.submit_call(
            lambda: score_prompts(service.adapter, [p.ids for p in prompts],
                                  [req.context_tokens] * len(prompts), rule, batch_size=score_batch_size),
            lambda result, error: loop.call_soon_threadsafe(_settle, future, result, error),
            time.monotonic() + service.timeout_s)
        return future

    def _stream(req, prompt, config, loop, kind: str):
        events: asyncio.Queue = asyncio.Queue()
        sent = [""]
        holdback = max((len(s) for s in config.until), default=1) - 1

        def on_block(job):
            text = service.outputs(prompt, job)[0].text
            keep = len(text) - holdback
            while keep > 0 and text[keep - 1] == "\ufffd":  # a character split across blocks
                keep -= 1
            delta = text[len(sent[0]):keep] if keep > len(sent[0]) and text.startswith(sent[0]) else ""
            sent[0] += delta
            loop.call_soon_threadsafe(events.put_nowait, ("block", delta))

        def on_done(job, error):
            loop.call_soon_threadsafe(events.put_nowait, ("done", (job, error)))

        job = service.job(prompt, req, config, on_done, on_block)
        scheduler.submit(job)  # QueueFull / ShuttingDown raise before the stream starts
        created, ident = int(time.time()), f"cmpl-{id(job):x}{int(time.time() * 1e3):x}"

        def chunk(text, finish=None):
            choice = ({"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
                      if kind == "text_completion" else
                      {"index": 0, "delta": {"content": text} if finish is None else {},
                       "finish_reason": finish})
            body = {"id": ident, "object": kind if kind == "text_completion" else "chat.completion.chunk",
                    "created": created, "model": service.model_name, "choices": [choice]}
            return f"data: {json.dumps(body)}\n\n"

        async def events_of():
            try:
                if req.echo:
                    yield chunk(prompt.text)
                while True:
                    kind, value = await events.get()
                    if kind == "block":
                        if value:
                            yield chunk(value)
                        continue
                    finished, error = value
                    if error is not None:
                        body = json.loads(error_response(error).body)
                        yield f"data: {json.dumps(body)}\n\n"
                    else:
                        out = service.outputs(prompt, finished)[0]
                        rest = out.text[len(sent[0]):] if out.text.startswith(sent[0]) else ""
                        finish = "length" if out.finish_reason == "length" else "stop"
                        if kind == "text_completion":
                            yield chunk(rest, finish)
                        else:  # chat: the text in a delta, then the finish in an empty one
                            if rest:
                                yield chunk(rest)
                            yield chunk("", finish)
                    yield "data: [DONE]\n\n"
                    return
            finally:
                job.cancel()  # a no-op once finished; frees the rows of a client that left
        return events_of()

    def too_large(message: str) -> JSONResponse:
        return _error(413, message, "invalid_request_error")

    return _Gate(BodyLimit(app, max_request_bytes, too_large), state, metrics)


def _encode_vector(vector, encoding_format: str):
    """A float32 vector as a JSON list, or as base64 of its little-endian bytes (the format the
    `openai` client asks for by default)."""
    values = vector.numpy().astype("<f4")
    return values.tolist() if encoding_format == "float" else base64.b64encode(values.tobytes()).decode()


def _settle(future: asyncio.Future, result, error) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _resolver(loop, future):
    return lambda job, error: loop.call_soon_threadsafe(_settle, future, job, error)


async def _until_done_or_gone(request: Request, waits: list) -> list:
    """The results of `waits`, in order; Cancelled when the client disconnects first."""
    gathered = asyncio.gather(*waits)
    while True:
        done, _ = await asyncio.wait({gathered}, timeout=_DISCONNECT_POLL_S)
        if done:
            return list(gathered.result())
        if await request.is_disconnected():
            gathered.cancel()
            raise Cancelled("the client disconnected")
