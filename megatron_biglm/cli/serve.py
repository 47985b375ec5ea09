"""`biglm-serve`: serve one model over an OpenAI-compatible HTTP API.

    biglm-serve --model PATH --host 127.0.0.1 --port 8000

PATH is a megatron checkpoint or an HF export, loaded by the one inference loader. When the
server listens it prints one line, `biglm-serve ready: model NAME at http://HOST:PORT` (with
`--port 0` the port the system chose). Endpoints, request fields and errors:
`megatron_biglm/serving/app.py` and `schema.py`. SIGTERM: new requests get 503, the ones in
flight finish, then the process exits 0 (a second SIGTERM or SIGINT exits at once).
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import uvicorn

from megatron_biglm.cli import refuse

_DRAIN_POLL_S = 0.05


def build_parser() -> argparse.ArgumentParser:
    from megatron_biglm.serving.body_limit import DEFAULT_MAX_REQUEST_BYTES

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="megatron checkpoint or HF export directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (the ready line names it)")
    p.add_argument("--served-model-name", help="the `model` clients send (default: the path's name)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting beyond the running batch; more get HTTP 429")
    p.add_argument("--max-rows", type=int, default=64,
                   help="candidate rows decoded at once; a megatron checkpoint preallocates this many "
                        "key/value slots of the model's length (the memory held for prefixes)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a request may take")
    p.add_argument("--score-batch-size", type=int, default=16, help="rows per forward when scoring")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                   help="the largest request body accepted (default 1 MiB); a larger one gets HTTP 413 "
                        "before it is read")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--dtype", help="default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--split-attention", choices=("auto", "on", "off"),
                   help="default: as trained (megatron) / on (HF export)")
    p.add_argument("--chat-template", default="default",
                   help="the instruction-tuning template of /v1/chat/completions: default, plain, or "
                        "none (no chat endpoint)")
    p.add_argument("--log-level", default="warning")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("max_queue", "max_rows", "score_batch_size", "max_request_bytes"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    try:
        server = _build(args)
    except (ValueError, FileNotFoundError) as exc:
        return refuse(exc, 2)
    server.run()
    return 0


def _build(args):
    from megatron_biglm.finetune.instruct.chat_template import get_template
    from megatron_biglm.generation.generator import MaskPredictGenerator
    from megatron_biglm.inference.loading import is_megatron_checkpoint
    from megatron_biglm.inference.protocol import SlotPrefixes
    from megatron_biglm.serving.app import ServerState, build_app
    from megatron_biglm.serving.block_decoder import ExactCacheBlockDecoder
    from megatron_biglm.serving.completions import CompletionService
    from megatron_biglm.serving.embeddings import load_embedder
    from megatron_biglm.serving.metrics import ServerMetrics
    from megatron_biglm.serving.scheduler import BlockScheduler
    from megatron_biglm.serving.slot_decoder import SlotPoolBlockDecoder

    load = {} if args.split_attention is None else {"split_attention": args.split_attention}
    # a megatron checkpoint keeps each request's prefix in a slot of a preallocated pool; an HF
    # export keeps transformers' cache
    layout = "pool" if is_megatron_checkpoint(args.model) else "grow"
    generator = MaskPredictGenerator.from_pretrained(args.model, device=args.device, dtype=args.dtype,
                                                     cache_layout=layout, **load)
    unembedded = generator.prompt_ids.warning()
    if unembedded is not None:
        print(f"biglm-serve: warning: {unembedded}", file=sys.stderr, flush=True)
    decoder = (SlotPoolBlockDecoder(generator.adapter, args.max_rows)
               if isinstance(generator.adapter, SlotPrefixes) else ExactCacheBlockDecoder(generator.adapter))
    name = args.served_model_name or Path(args.model).resolve().name
    service = CompletionService(generator, name, timeout_s=args.timeout, block_modes=decoder.block_modes)
    metrics = ServerMetrics()
    scheduler = BlockScheduler(decoder, max_queue=args.max_queue, max_rows=args.max_rows, stats=metrics)
    metrics.queue_length = lambda: scheduler.queue_length
    metrics.running_rows = lambda: scheduler.running_rows
    state = ServerState()
    template = None if args.chat_template == "none" else get_template(args.chat_template)
    embedder = load_embedder(args.model, generator.adapter, generator.tokenizer)
    app = build_app(service, scheduler, metrics, state, embedder=embedder, chat_template=template,
                    score_batch_size=args.score_batch_size, max_request_bytes=args.max_request_bytes)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=False, lifespan="off")
    return _DrainingServer(config, state, scheduler, name)


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, with SIGTERM draining instead of stopping: requests arriving after it
    get 503, the ones in flight finish, then the server stops and `main` returns 0."""

    def __init__(self, config, state, scheduler, name: str):
        super().__init__(config)
        self.state, self.scheduler, self.name = state, scheduler, name

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        print(f"biglm-serve ready: model {self.name} at http://{host}:{port}", flush=True)

    def handle_exit(self, sig, frame) -> None:
        if sig == signal.SIGTERM and not self.state.draining:
            self.state.draining = True
            threading.Thread(target=self._drain, name="biglm-drain", daemon=True).start()
            return
        super().handle_exit(sig, frame)

    def _drain(self) -> None:
        while self.state.in_flight > 0 or self.scheduler.busy:
            time.sleep(_DRAIN_POLL_S)
        self.scheduler.close()
        self.should_exit = True


if __name__ == "__main__":
    sys.exit(main())
