"""The serving scheduler: one worker thread that decodes many requests together, a block at a time.

Mask-Predict decodes a request's slots block by block; between two blocks nothing of a request
lives on the model but its prefix. That is where the scheduler batches: at every block boundary
it admits waiting requests into the running set (up to `max_rows` candidate rows, which bounds
the keys/values held for prefixes), drops the ones whose client went away or whose time ran
out, runs one block for every running candidate, and hands back each request the moment its
last block is done. New requests therefore join between blocks instead of waiting for a batch
to drain.

Candidates whose blocks decode alike (same T, remasking, sampling settings) run in one
`BlockDecoder.decode_block` call; the decoder is a `typing.Protocol`, so the scheduler does not
know how prefixes are cached. Each candidate draws from its own seeded generator, so a request's
answer does not depend on who shares its batch.

Other model work (scoring) goes through `submit_call`: it runs on the same thread between
blocks, so the model is only ever used by one thread.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from megatron_biglm.generation.blocks import Candidate
from megatron_biglm.generation.config import GenerationConfig


class QueueFull(RuntimeError):
    """The waiting queue holds `max_queue` requests; the client should retry later."""


class ShuttingDown(RuntimeError):
    """The scheduler no longer takes requests."""


class RequestTimeout(RuntimeError):
    """A request ran past its deadline and was dropped at a block boundary."""


class Cancelled(RuntimeError):
    """The client went away; the request was dropped at a block boundary."""


class BlockDecoder(Protocol):
    """Capability: decode the next block of each candidate, in place (tokens, log-confidences,
    passes appended; `stopped` set at EOS when the config cuts there), holding whatever it
    keeps of a candidate between blocks until `release`. `block_modes`: the values of
    `GenerationConfig.blocks` it decodes."""

    block_modes: tuple[str, ...]

    def decode_block(self, candidates: Sequence[Candidate], config: GenerationConfig,
                     block_size: int, slot_offset: int) -> None:
        ...

    def release(self, candidates: Sequence[Candidate]) -> None:
        """The candidates' request left (done, failed, timed out, cancelled): free what they hold."""
        ...


@dataclass
class GenerationJob:
    """One request: `groups[j]` are the length candidates of choice j. `on_block(job)` is called
    after each block (streaming); `on_done(job, error)` once, from the worker thread."""

    config: GenerationConfig
    groups: list[list[Candidate]]
    block_size: int
    deadline: float
    on_done: Callable[["GenerationJob", BaseException | None], None]
    on_block: Callable[["GenerationJob"], None] | None = None
    blocks_done: int = 0
    cancelled: bool = False
    finished: bool = False
    submitted: float = field(default_factory=time.monotonic)

    @property
    def candidates(self) -> list[Candidate]:
        return [c for g in self.groups for c in g]

    @property
    def rows(self) -> int:
        return len(self.candidates)

    def live(self) -> list[Candidate]:
        return [c for c in self.candidates if c.block_width(self.block_size) > 0]

    def cancel(self) -> None:
        """Ask the worker to drop this request at the next block boundary."""
        self.cancelled = True


@dataclass
class _Call:
    fn: Callable[[], object]
    on_done: Callable[[object, BaseException | None], None]
    deadline: float


class SchedulerStats(Protocol):
    """What the scheduler reports (the server's metrics implement it)."""

    def block_step(self, rows: int, tokens: int, seconds: float) -> None:
        ...


def _group_key(job: GenerationJob) -> tuple:
    c = job.config
    offset = job.blocks_done * job.block_size if c.min_length else 0
    return (c.blocks, c.steps, c.remask, c.temperature, c.top_k, c.top_p, c.confidence_threshold,
            c.min_length, offset, job.block_size, c.eos_cut)


class BlockScheduler:
    """Waiting queue (at most `max_queue`), running set (at most `max_rows` candidate rows; a
    single request larger than that runs alone), one worker thread."""

    def __init__(self, decoder: BlockDecoder, *, max_queue: int, max_rows: int,
                 stats: SchedulerStats | None = None):
        if max_queue < 1 or max_rows < 1:
            raise ValueError(f"max_queue and max_rows must be >= 1, got {max_queue}, {max_rows}")
        self.decoder = decoder
        self.max_queue, self.max_rows = int(max_queue), int(max_rows)
        self.stats = stats
        self._waiting: deque = deque()
        self._running: list[GenerationJob] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="biglm-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ client side
    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    @property
    def running_rows(self) -> int:
        return sum(j.rows for j in self._running)

    @property
    def busy(self) -> bool:
        return bool(self._waiting or self._running)

    def submit(self, job: GenerationJob | _Call) -> None:
        with self._cond:
            if self._closed:
                raise ShuttingDown("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (the queue holds "
                                f"{self.max_queue})")
            self._waiting.append(job)
            self._cond.notify()

    def submit_call(self, fn: Callable[[], object], on_done: Callable[[object, BaseException | None], None],
                    deadline: float) -> None:
        """Run `fn()` on the worker thread between blocks; `on_done(result, error)` after."""
        self.submit(_Call(fn, on_done, deadline))

    def close(self, wait: bool = True) -> None:
        """Take no more requests; the worker finishes what it holds, then stops."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if wait:
            self._thread.join()

    # ------------------------------------------------------------------ worker
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._running and not self._closed:
                    self._cond.wait()
                if self._closed and not self._waiting and not self._running:
                    return
                calls = self._admit()
            for call in calls:
                self._run_call(call)
            self._drop_gone()
            if self._running:
                self._step()

    def _admit(self) -> list[_Call]:
        calls, rows = [], self.running_rows
        while self._waiting:
            head = self._waiting[0]
            if isinstance(head, _Call):
                calls.append(self._waiting.popleft())
                continue
            if head.cancelled:  # its client left while it waited
                self._finish(self._waiting.popleft(), Cancelled("the client disconnected"))
                continue
            if self._running and rows + head.rows > self.max_rows:
                break
            self._running.append(self._waiting.popleft())
            rows += head.rows
        return calls

    def _run_call(self, call: _Call) -> None:
        if time.monotonic() > call.deadline:
            call.on_done(None, RequestTimeout("the request waited past its timeout"))
            return
        try:
            result = call.fn()
        except Exception as exc:  # a model failure answers this request only
            call.on_done(None, exc)
            return
        call.on_done(result, None)

    def _drop_gone(self) -> None:
        now = time.monotonic()
        for job in list(self._running):
            if job.cancelled:
                self._finish(job, Cancelled("the client disconnected"))
            elif now > job.deadline:
                self._finish(job, RequestTimeout("the request ran past its timeout"))

    def _step(self) -> None:
        groups: dict[tuple, list[GenerationJob]] = {}
        for job in self._running:
            groups.setdefault(_group_key(job), []).append(job)
        start = time.monotonic()
        rows = tokens = 0
        for jobs in groups.values():
            candidates = [c for j in jobs for c in j.live()]
            before = sum(len(c.tokens) for c in candidates)
            offset = jobs[0].blocks_done * jobs[0].block_size
            try:
                self.decoder.decode_block(candidates, jobs[0].config, jobs[0].block_size, offset)
            except Exception as exc:  # the model failed on this batch: answer its requests, keep serving
                for job in jobs:
                    self._finish(job, exc)
                continue
            rows += len(candidates)
            tokens += sum(len(c.tokens) for c in candidates) - before
            for job in jobs:
                job.blocks_done += 1
                if not job.live():
                    self._finish(job, None)
                elif job.on_block is not None:
                    job.on_block(job)
        if self.stats is not None and rows:
            self.stats.block_step(rows, tokens, time.monotonic() - start)

    def _finish(self, job: GenerationJob, error: BaseException | None) -> None:
        if job in self._running:
            self._running.remove(job)
        self.decoder.release(job.candidates)
        if not job.finished:
            job.finished = True
            job.on_done(job, error)
