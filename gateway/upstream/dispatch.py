"""Dispatch: run a routed request on a worker, failing over before the first token.

The order of tries is: the chosen pool's best available worker, its other available
workers, then the pools after it in the router's order (the policy's fallbacks, plain
pools last), at most `server.max_attempts` workers in all; a stream's first token must
come within `server.first_token_timeout_s`. Failures that say nothing
about the request itself are retried: connection errors, timeouts, 5xx. A worker's 4xx
is final. Once a stream's first token has arrived the client owns that worker's
answer: no retry can happen after tokens were sent. Every outcome feeds the worker's
circuit breaker (`gateway.pools`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace

from opentelemetry.trace import Tracer

from gateway.config import GatewayConfig, TenantConfig
from gateway.errors import GatewayError, NoHealthyWorker, UpstreamTimeout, UpstreamUnavailable
from gateway.pools import Pool, Worker
from gateway.routing.admission import Admission
from gateway.routing.router import PoolRouter
from gateway.schemas import GenerationRequest
from gateway.telemetry.prometheus import Recorder
from gateway.telemetry.spans import NO_TRACE, RequestTrace, Trace
from gateway.tenants.auth import Authenticator
from gateway.tenants.limits import Limits
from gateway.upstream.adapters.base import (
    Adapter,
    Delta,
    GenerationResult,
    SpecStats,
    StreamItem,
    Usage,
)
from policies.types import Decision, RequestProfile, RequestRecord
from workers.tracer_provider import ListeningTracerProvider

log = logging.getLogger("specroute.gateway")


@dataclass(slots=True)
class Gateway:
    """Everything a request needs, built once in the app lifespan."""

    config: GatewayConfig
    pools: dict[str, Pool]
    router: PoolRouter
    auth: Authenticator
    limits: Limits
    adapters: dict[str, Adapter]
    recorder: Recorder
    tracer: Tracer
    provider: ListeningTracerProvider | None = None  # None: always emit spans
    admission: Admission | None = None  # None: no per-pool slots (unit tests)


@dataclass(slots=True)
class Lease:
    """One worker serving one request; `release()` gives the slot back exactly once."""

    pool: Pool
    worker: Worker
    decision: Decision
    load: int
    workers: int = 1  # available workers in the pool at dispatch
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.worker.outstanding -= 1

    def succeeded(self) -> None:
        self.worker.breaker.success()

    def failed(self, exc: GatewayError) -> None:
        """Count a failure against the worker; connection refused opens its breaker."""
        log.info("worker %s of pool %s failed: %s", self.worker.url, self.pool.name,
                 exc.message)
        hard = exc.code == "upstream_connect_error"
        self.worker.breaker.failure(time.monotonic(), hard=hard)


@dataclass(slots=True)
class Timer:
    """Wall-clock facts of one request, for the telemetry record."""

    start: float = field(default_factory=time.perf_counter)
    first_token: float = 0.0

    def token(self) -> None:
        if not self.first_token:
            self.first_token = time.perf_counter()


def _candidates(gateway: Gateway, pools: list[Pool], decision: Decision
                ) -> Iterator[tuple[Pool, Worker, Decision]]:
    tried: set[str] = set()
    attempts = 0
    for pool in pools:
        if pool.name != decision.pool:
            k = decision.k if pool.config.capabilities.per_request_k else pool.config.k
            decision = replace(decision, pool=pool.name, method=pool.config.method, k=k,
                               reason=f"{decision.reason}; failover to {pool.name}")
        while attempts < gateway.config.server.max_attempts:
            worker = pool.pick(tried)
            if worker is None:
                break
            tried.add(worker.url)
            attempts += 1
            yield pool, worker, decision


def format_unenforced(request: GenerationRequest, pool: Pool) -> bool:
    """A `json_object` request on a pool without constrained decoding: the router sends
    one there only when no pool with it is eligible (docs/GATEWAY.md, JSON mode)."""
    return request.wants_json_object and not pool.config.capabilities.constrained_decoding


def for_pool(request: GenerationRequest, pool: Pool) -> GenerationRequest:
    """The request as this pool's worker gets it: `response_format` json_object removed
    where the pool cannot enforce it (an engine without constrained decoding rejects it)."""
    if not format_unenforced(request, pool):
        return request
    body = {k: v for k, v in request.body.items() if k != "response_format"}
    return replace(request, body=body, response_format=None)


def warning_headers(request: GenerationRequest, pool: Pool) -> list[tuple[bytes, bytes]]:
    if not format_unenforced(request, pool):
        return []
    return [(b"x-specroute-warning",
             f"response_format json_object not enforced by pool {pool.name}".encode(
                 "ascii", "replace"))]


def _lease(pool: Pool, worker: Worker, decision: Decision) -> Lease:
    load, workers = pool.outstanding, pool.healthy_workers
    worker.outstanding += 1
    worker.breaker.begin(time.monotonic())
    return Lease(pool=pool, worker=worker, decision=decision, load=load, workers=workers)


RETRYABLE = (UpstreamUnavailable, UpstreamTimeout)


def _is_empty(item: StreamItem) -> bool:
    """A delta with nothing the client lacks: the writer adds the role itself."""
    return isinstance(item, Delta) and not item.text and item.finish_reason is None and (
        not item.extra or item.extra == {"role": "assistant"})


async def first_item(items: AsyncIterator[StreamItem], worker: str,
                     timeout_s: float) -> StreamItem:
    """A stream's first item with something in it; a worker silent past `timeout_s`
    (stalled, or prefill too slow) is an `UpstreamTimeout`, retried like any other."""
    try:
        async with asyncio.timeout(timeout_s):
            item = await anext(items)
            while _is_empty(item):
                item = await anext(items)
            return item
    except TimeoutError as exc:
        raise UpstreamTimeout(f"worker {worker} sent no first token within {timeout_s:g} s",
                              code="upstream_timeout") from exc


async def generate(gateway: Gateway, request: GenerationRequest, decision: Decision,
                   pools: list[Pool], trace: Trace = NO_TRACE
                   ) -> tuple[Lease, GenerationResult]:
    """Non-streaming dispatch; the returned lease is already released."""
    error: GatewayError = NoHealthyWorker(
        f"no healthy worker in pool {decision.pool!r}", code="no_healthy_worker")
    for pool, worker, attempt in _candidates(gateway, pools, decision):
        lease = _lease(pool, worker, attempt)
        adapter = gateway.adapters[pool.config.engine]
        try:
            with trace.upstream(worker.url, pool.name, attempt.k):
                result = await adapter.generate(worker.url, for_pool(request, pool),
                                                pool.config, attempt.k)
        except RETRYABLE as exc:
            lease.failed(exc)
            error = exc
        except GatewayError:
            lease.succeeded()  # the worker answered: a 4xx is about the request
            raise
        else:
            lease.succeeded()
            return lease, result
        finally:
            lease.release()
    raise error


async def open_stream(gateway: Gateway, request: GenerationRequest, decision: Decision,
                      pools: list[Pool], trace: Trace = NO_TRACE
                      ) -> tuple[Lease, StreamItem, AsyncIterator[StreamItem]]:
    """Start a stream and wait for its first item; the caller releases the lease."""
    error: GatewayError = NoHealthyWorker(
        f"no healthy worker in pool {decision.pool!r}", code="no_healthy_worker")
    for pool, worker, attempt in _candidates(gateway, pools, decision):
        lease = _lease(pool, worker, attempt)
        items = gateway.adapters[pool.config.engine].stream(
            worker.url, for_pool(request, pool), pool.config, attempt.k)
        try:
            with trace.upstream(worker.url, pool.name, attempt.k):  # to the first token
                first = await first_item(items, worker.url,
                                         gateway.config.server.first_token_timeout_s)
        except RETRYABLE as exc:
            lease.failed(exc)
            error = exc
        except BaseException as exc:
            if isinstance(exc, GatewayError):
                lease.succeeded()
            lease.release()
            await items.aclose()  # type: ignore[attr-defined]
            raise
        else:
            lease.succeeded()
            return lease, first, items
        lease.release()
        await items.aclose()  # type: ignore[attr-defined]
    raise error


def slo_met(tenant: TenantConfig, ttft_s: float, itl_s: float, e2e_s: float, tokens: int,
            streamed: bool) -> bool:
    """Streaming: TTFT and mean inter-token time within the tenant's targets. Not
    streaming (the client sees only the end): the last token by the deadline a streaming
    client with those targets would have had, ttft + tpot x (tokens - 1)."""
    if streamed:
        return ttft_s * 1000 <= tenant.slo_ttft_ms and itl_s * 1000 <= tenant.slo_tpot_ms
    return e2e_s * 1000 <= tenant.slo_ttft_ms + tenant.slo_tpot_ms * max(tokens - 1, 0)


def verify_steps(spec: SpecStats, k: int, tokens: int) -> int | None:
    """Verify steps behind `tokens`: as reported, or from the reported accept length
    (vLLM reports only its mean), or one per token without speculation; None when a
    speculative worker reported neither, which the policy must not read as anything."""
    if tokens <= 0:
        return 0
    if spec.verify_steps > 0:
        return spec.verify_steps
    if spec.accept_length > 0:
        return max(round(tokens / spec.accept_length), 1)
    return tokens if k == 0 else None


def record(gateway: Gateway, *, request: GenerationRequest, profile: RequestProfile,
           tenant: TenantConfig, decision: Decision, load: int, timer: Timer, usage: Usage,
           spec: SpecStats, ok: bool, workers: int = 1, trace: Trace | None = None,
           finish_reason: str | None = None) -> None:
    """Report one finished request to the recorder and end its trace (`trace`; None:
    one span for the whole request, made then).

    Timed now; reported on the event loop's next turn when one is running, after the
    response's bytes have been flushed (`gateway.http.serve.CoalescingTransport` flushes
    on that turn too, first): the ~30 µs of Prometheus, policy feed, token accounting
    and span never delay the answer. Without a running loop (tests), at once.

    `load` is the pool's outstanding requests at dispatch, this one excluded. A
    non-streaming answer arrives whole: its TTFT is the end-to-end time less the decode
    time the worker reported (`SpecStats.decode_s`), else one verify step's share of the
    end-to-end time, prefill then spread over the steps (which reads a request of few
    steps — high acceptance — as slow steps)."""
    report = functools.partial(
        _report, gateway, time.perf_counter(), request=request, profile=profile,
        tenant=tenant, decision=decision, load=load, timer=timer, usage=usage, spec=spec,
        ok=ok, workers=workers, trace=trace, finish_reason=finish_reason)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        report()
    else:
        loop.call_soon(report)


def _report(gateway: Gateway, end: float, *, request: GenerationRequest,
            profile: RequestProfile, tenant: TenantConfig, decision: Decision, load: int,
            timer: Timer, usage: Usage, spec: SpecStats, ok: bool, workers: int,
            trace: Trace | None, finish_reason: str | None) -> None:
    e2e = end - timer.start
    tokens = usage.completion_tokens
    steps = verify_steps(spec, decision.k, tokens)
    accept = spec.accept_length or (tokens / steps if steps else 0.0)
    if request.stream:
        ttft = (timer.first_token or end) - timer.start
        itl = (end - timer.first_token) / (tokens - 1) if tokens > 1 and timer.first_token \
            else 0.0
    elif spec.decode_s is not None and tokens > 1:
        ttft = max(e2e - spec.decode_s, 0.0)
        itl = (e2e - ttft) / (tokens - 1)
    else:
        ttft = e2e / max(steps or tokens, 1)
        itl = (e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0
    entry = RequestRecord(
        model=request.model, pool=decision.pool, method=decision.method, k=decision.k,
        task=profile.task, temperature_bucket=profile.temperature_bucket,
        prompt_tokens=usage.prompt_tokens, output_tokens=tokens, verify_steps=steps,
        accept_length=accept, load=load, ttft_s=ttft, itl_s=itl, e2e_s=e2e,
        tenant=tenant.name, ok=ok, timestamp=time.time(), workers=max(1, workers),
        pinned=decision.pinned,
        own_draft_tokens=(spec.proposed_drafts / (steps - 1)
                          if spec.batch is not None and steps and steps > 1 else None),
        batch=spec.batch, batch_draft_tokens=spec.batch_draft_tokens,
        slo_met=ok and slo_met(tenant, ttft, itl, e2e, tokens, request.stream),
        extra={"explored": True} if decision.explored else {},
    )
    gateway.recorder.record(entry)
    if spec.batch is not None and (pool := gateway.pools.get(decision.pool)) is not None:
        pool.note_batch(spec.batch, time.monotonic())
    gateway.limits.spend(tenant, usage.prompt_tokens + tokens)
    if trace is None and (gateway.provider is None or gateway.provider.listening):
        trace = RequestTrace(gateway.tracer, f"specroute {request.endpoint}", None,
                             start_time=time.time_ns() - int(e2e * 1e9))
    if trace is not None:
        trace.set("specroute.decision_reason", decision.reason)
        trace.finish(entry, finish_reason)
