"""The server's counters in Prometheus' text format (`GET /metrics`).

- `biglm_requests_total{endpoint,status}`: answered requests by HTTP status;
- `biglm_queue_length`, `biglm_running_rows`: waiting requests, candidate rows being decoded;
- `biglm_batch_rows`: a histogram of the rows of each block step (how much batching happened);
- `biglm_generated_tokens_total` and `biglm_tokens_per_second` (over the last 10 s of steps);
- `biglm_request_seconds{endpoint}`: a latency histogram.
Written by hand (a few lines of the exposition format), so the server needs no client library.
"""
from __future__ import annotations

import threading
import time
from collections import Counter, deque
from typing import Callable

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_RATE_WINDOW_S = 10.0


class _Histogram:
    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.total = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total += 1
        self.sum += value

    def lines(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        out = [f'{name}_bucket{{{labels}{sep}le="{b:g}"}} {c}' for b, c in zip(self.bounds, self.counts)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.total}')
        tail = f"{{{labels}}}" if labels else ""
        out += [f"{name}_sum{tail} {self.sum:.6f}", f"{name}_count{tail} {self.total}"]
        return out


class ServerMetrics:
    """Thread-safe counters; the scheduler reports block steps (`SchedulerStats`), the HTTP layer
    answered requests. `queue_length` and `running_rows` are read when the page is rendered."""

    def __init__(self, queue_length: Callable[[], int] = lambda: 0,
                 running_rows: Callable[[], int] = lambda: 0):
        self.queue_length, self.running_rows = queue_length, running_rows
        self._lock = threading.Lock()
        self.requests: Counter = Counter()
        self.latency: dict[str, _Histogram] = {}
        self.batch_rows = _Histogram(ROW_BUCKETS)
        self.generated_tokens = 0
        self._recent: deque = deque()  # (time, tokens)

    def block_step(self, rows: int, tokens: int, seconds: float) -> None:
        now = time.monotonic()
        with self._lock:
            self.batch_rows.observe(rows)
            self.generated_tokens += tokens
            self._recent.append((now, tokens))
            while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
                self._recent.popleft()

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(endpoint, int(status))] += 1
            self.latency.setdefault(endpoint, _Histogram(LATENCY_BUCKETS)).observe(seconds)

    def tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            recent = [t for when, t in self._recent if when >= now - _RATE_WINDOW_S]
        return sum(recent) / _RATE_WINDOW_S

    def render(self) -> str:
        rate = self.tokens_per_second()
        with self._lock:
            lines = ["# TYPE biglm_requests_total counter"]
            lines += [f'biglm_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            lines += ["# TYPE biglm_queue_length gauge", f"biglm_queue_length {self.queue_length()}",
                      "# TYPE biglm_running_rows gauge", f"biglm_running_rows {self.running_rows()}",
                      "# TYPE biglm_batch_rows histogram", *self.batch_rows.lines("biglm_batch_rows"),
                      "# TYPE biglm_generated_tokens_total counter",
                      f"biglm_generated_tokens_total {self.generated_tokens}",
                      "# TYPE biglm_tokens_per_second gauge", f"biglm_tokens_per_second {rate:.3f}",
                      "# TYPE biglm_request_seconds histogram"]
            for endpoint, hist in sorted(self.latency.items()):
                lines += hist.lines("biglm_request_seconds", f'endpoint="{endpoint}"')
        return "\n".join(lines) + "\n"


def parse_counters(text: str) -> dict[str, float]:
    """`{series: value}` of a rendered page (comments skipped): what a scraper would read."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            out[series] = float(value)
    return out
