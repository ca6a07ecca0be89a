"""Per-request telemetry: the recorder hook and Prometheus metrics (spans: gateway/telemetry/spans.py).

Every finished request becomes one `policies.types.RequestRecord` handed to a
`Recorder`. `record()` must not block: the default `PrometheusRecorder` only bumps
in-process counters; the learned policy's Redis telemetry store (`gateway.routing.policy`)
enqueues and batches off the hot path; `FanoutRecorder` feeds both. Each gateway app owns its own `CollectorRegistry`, so several apps in one
process (tests) never collide.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

from gateway.pools import Pool
from gateway.telemetry.series import Counter, Histogram
from policies.types import RequestRecord

log = logging.getLogger("specroute.gateway")

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
ACCEPT_BUCKETS = (1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 8, 12)


class Recorder(Protocol):
    def record(self, record: RequestRecord) -> None: ...


class FanoutRecorder:
    """Hands each record to several recorders (Prometheus, the learning policy). A
    recorder's bug is logged once and never reaches the request that finished."""

    def __init__(self, *recorders: Recorder) -> None:
        self.recorders = recorders
        self._failed: set[int] = set()

    def record(self, record: RequestRecord) -> None:
        for i, recorder in enumerate(self.recorders):
            try:
                recorder.record(record)
            except Exception:  # noqa: BLE001 - telemetry must never fail a request
                if i not in self._failed:
                    self._failed.add(i)
                    log.exception("recorder %s failed", type(recorder).__name__)


class PrometheusRecorder:
    """Request counts, latency, TTFT, tokens and accept length per pool."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("pool", "method")
        self.requests = Counter("specroute_requests", "Finished requests",
                                (*labels, "task", "ok"), registry=registry)
        self.latency = Histogram("specroute_request_seconds", "End-to-end request time",
                                 labels, buckets=LATENCY_BUCKETS, registry=registry)
        self.ttft = Histogram("specroute_ttft_seconds", "Time to first token", labels,
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.tokens = Counter("specroute_output_tokens", "Generated tokens", labels,
                              registry=registry)
        self.anomalies = Counter("specroute_acceptance_anomalies",
                                 "Requests whose accept length was 3x above or below the "
                                 "decision's prediction", labels, registry=registry)
        self.accept = Histogram("specroute_accept_length",
                                "Tokens per verify step (bonus included)", labels,
                                buckets=ACCEPT_BUCKETS, registry=registry)
        branch = ("pool", "branch")
        self.branch_steps = Counter("specroute_draft_branch_steps",
                                    "A hybrid pool's decode steps by the branch that drafted "
                                    "them (ngram, eagle; none: an empty draft)", branch,
                                    registry=registry)
        self.branch_accepted = Counter("specroute_draft_branch_accepted_tokens",
                                       "A hybrid pool's accepted draft tokens by branch",
                                       branch, registry=registry)

        # label lookups cost more than the updates; children are cached per label set
        self._children: dict[tuple[str, ...], tuple] = {}

    def _series(self, record: RequestRecord) -> tuple:
        key = (record.pool, record.method, record.task, str(record.ok).lower())
        series = self._children.get(key)
        if series is None:
            labels = key[:2]
            series = (self.requests.labels(*key), self.latency.labels(*labels),
                      self.ttft.labels(*labels), self.tokens.labels(*labels),
                      self.accept.labels(*labels))
            self._children[key] = series
        return series

    def record(self, record: RequestRecord) -> None:
        requests, latency, ttft, tokens, accept = self._series(record)
        requests.inc()
        if "anomaly" in record.extra:
            self.anomalies.labels(record.pool, record.method).inc()
        if not record.ok:
            return
        latency.observe(record.e2e_s)
        ttft.observe(record.ttft_s)
        tokens.inc(record.output_tokens)
        if record.accept_length > 0:
            accept.observe(record.accept_length)
        for name, (steps, accepted) in (record.extra.get("drafts") or {}).items():
            self.branch_steps.labels(record.pool, name).inc(steps)
            self.branch_accepted.labels(record.pool, name).inc(accepted)


class HttpMetrics:
    """What operators need beside the per-request records: every HTTP answer by route
    and status (the 400s, 401s, 413s, 429s and 500s that never reach the recorder), the
    time to the end of each response by route, and each pool's workers. `route` is the
    route's template (`/v1/models/{model:path}`), `other` for paths no route matches, so
    a scanner cannot grow the label set."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.responses = Counter("specroute_http_responses", "HTTP responses by route and "
                                 "status (499: the client left before any answer)",
                                 ("route", "status"), registry=registry)
        self.seconds = Histogram("specroute_http_request_seconds", "Request start to the "
                                 "end of its response, by route", ("route",),
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.workers_up = Gauge("specroute_pool_workers_up", "Workers taking requests: "
                                "healthy, breaker not open, not draining", ("pool",),
                                registry=registry)
        self.last_resort = Gauge("specroute_pool_last_resort", "1 while the pool has no "
                                 "worker up and sends to those whose probes only timed out",
                                 ("pool",), registry=registry)
        self.workers = Gauge("specroute_pool_workers", "Workers known (config and registry)",
                             ("pool",), registry=registry)
        self.tasks = Gauge("specroute_event_loop_tasks", "asyncio tasks alive (the scrape's "
                           "own included); back to its idle value once load stops",
                           registry=registry)
        ProcessCollector(registry=registry)  # process_resident_memory_bytes, _open_fds, ...
        self._children: dict[tuple[str, int], tuple] = {}

    def observe(self, route: str, status: int, seconds: float) -> None:
        series = self._children.get((route, status))
        if series is None:
            series = (self.responses.labels(route, str(status)), self.seconds.labels(route))
            self._children[(route, status)] = series
        series[0].inc()
        series[1].observe(seconds)

    def update(self, pools: dict[str, Pool]) -> None:
        """Set the gauges (at scrape time, from the event loop: read, not counted)."""
        self.tasks.set(len(asyncio.all_tasks()))
        for name, pool in pools.items():
            self.workers_up.labels(name).set(pool.up_workers)
            self.last_resort.labels(name).set(int(pool.in_panic(time.monotonic())))
            self.workers.labels(name).set(len(pool.workers))
