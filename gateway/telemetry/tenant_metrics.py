"""Prometheus series per tenant: SLO attainment, TTFT and ITL, goodput, requests shed or
limited; per pool: queue depth and wait; decisions by the SLO-aware policy's verdict.

Also accept length per pool x request class (the dashboard's heat map). Fed by the
recorder fan-out (finished requests), by admission (queues, shedding), by the
limits (429s) and by the SLO-aware policy (decisions). Attainment is both a counter by outcome
(`specroute_tenant_requests_total{tenant, outcome="met|missed|failed"}`: rate ratios over
any window in PromQL) and a gauge over each tenant's last `ATTAINMENT_WINDOW` requests.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Gauge

from gateway.telemetry.series import Counter, Histogram
from policies.types import RequestRecord

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
ITL_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
ACCEPT_BUCKETS = (1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 8, 12)
ATTAINMENT_WINDOW = 100


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("specroute_tenant_requests", "Finished requests per tenant "
                                "by SLO outcome", ("tenant", "outcome"), registry=registry)
        self.attainment = Gauge("specroute_tenant_slo_attainment", "Share of the tenant's "
                                f"last {ATTAINMENT_WINDOW} requests that met its SLO",
                                ("tenant",), registry=registry)
        self.ttft = Histogram("specroute_tenant_ttft_seconds", "Time to first token",
                              ("tenant",), buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram("specroute_tenant_itl_seconds", "Mean inter-token latency of a "
                             "request", ("tenant",), buckets=ITL_BUCKETS, registry=registry)
        self.goodput = Counter("specroute_tenant_goodput_tokens", "Output tokens of requests "
                               "that met their SLO", ("tenant",), registry=registry)
        self.depth = Gauge("specroute_queue_depth", "Requests waiting for a slot",
                           ("pool",), registry=registry)
        self.wait = Histogram("specroute_queue_wait_seconds", "Time a request waited for a "
                              "slot", ("pool",), buckets=LATENCY_BUCKETS, registry=registry)
        self.shed_total = Counter("specroute_shed", "Requests shed by admission (429)",
                                  ("tenant", "reason"), registry=registry)
        self.limited_total = Counter("specroute_rate_limited", "Requests refused by the "
                                     "tenant's rate limits", ("tenant", "code"),
                                     registry=registry)
        self.decisions = Counter("specroute_decisions", "Routing decisions by the SLO "
                                 "hook's verdict", ("reason",), registry=registry)
        self.accept = Histogram("specroute_accept_length_by_task", "Tokens per verify step "
                                "(bonus included) per pool and request class",
                                ("pool", "task"), buckets=ACCEPT_BUCKETS, registry=registry)
        self._series: dict[str, tuple] = {}  # tenant -> its children (label lookups cost)
        self._children: dict[tuple, object] = {}  # (metric, *labels) -> child, the rest

    def _child(self, metric, *labels: str):  # noqa: ANN001, ANN202 - any prometheus metric
        """The metric's child for `labels`, looked up once (`labels()` is not cheap and
        runs three to four times a request)."""
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # Recorder
    def record(self, record: RequestRecord) -> None:
        tenant = record.tenant
        if not record.ok:
            self._child(self.requests, tenant, "failed").inc()
            return
        series = self._series.get(tenant)
        if series is None:
            series = self._series[tenant] = (
                self.requests.labels(tenant, "met"), self.requests.labels(tenant, "missed"),
                self.attainment.labels(tenant), self.ttft.labels(tenant),
                self.itl.labels(tenant), self.goodput.labels(tenant),
                deque(maxlen=ATTAINMENT_WINDOW))
        met, missed, attainment, ttft, itl, goodput, recent = series
        (met if record.slo_met else missed).inc()
        recent.append(record.slo_met)
        attainment.set(recent.count(True) / len(recent))
        ttft.observe(record.ttft_s)
        if record.output_tokens > 1:
            itl.observe(record.itl_s)
        if record.slo_met:
            goodput.inc(record.output_tokens)
        if record.accept_length > 0:
            self._child(self.accept, record.pool, record.task).observe(record.accept_length)

    # AdmissionMetrics
    def queue_depth(self, pool: str, depth: int) -> None:
        self._child(self.depth, pool).set(depth)

    def queue_wait(self, pool: str, seconds: float) -> None:
        self._child(self.wait, pool).observe(seconds)

    def shed(self, tenant: str, reason: str) -> None:
        self.shed_total.labels(tenant, reason).inc()

    def limited(self, tenant: str, code: str) -> None:
        self.limited_total.labels(tenant, code).inc()

    def decided(self, reason: str) -> None:
        self._child(self.decisions, reason).inc()
