"""Dispatch: run a routed request on a worker, failing over before the first token.

The order of tries is: least-loaded healthy worker of the chosen pool, the pool's
other healthy workers, then the policy's fallback pools, at most
`server.max_attempts` workers in all. Only failures that say nothing about the
request itself are retried (connection refused, 5xx); a worker's 4xx or a timeout is
final. Once a stream's first item has arrived, the client owns that worker's answer:
no retry can happen after tokens were sent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace

from opentelemetry.trace import Tracer

from gateway.adapters.base import Adapter, Generation, SpecStats, StreamItem, Usage
from gateway.auth import Authenticator, RateLimiter
from gateway.config import GatewayConfig, TenantConfig
from gateway.errors import GatewayError, NoHealthyWorker, UpstreamUnavailable
from gateway.pools import Pool, Worker
from gateway.routing import Router
from gateway.schemas import GenerationRequest
from gateway.telemetry import Recorder, span_attributes
from policies.types import Decision, RequestProfile, RequestRecord


@dataclass(slots=True)
class Gateway:
    """Everything a request needs, built once in the app lifespan."""

    config: GatewayConfig
    pools: dict[str, Pool]
    router: Router
    auth: Authenticator
    limiter: RateLimiter
    adapters: dict[str, Adapter]
    recorder: Recorder
    tracer: Tracer


@dataclass(slots=True)
class Lease:
    """One worker serving one request; `release()` gives the slot back exactly once."""

    pool: Pool
    worker: Worker
    decision: Decision
    load: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.worker.outstanding -= 1


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


def _lease(pool: Pool, worker: Worker, decision: Decision) -> Lease:
    load = pool.outstanding
    worker.outstanding += 1
    return Lease(pool=pool, worker=worker, decision=decision, load=load)


def _note_failure(worker: Worker, exc: GatewayError) -> None:
    if exc.code == "upstream_connect_error":
        worker.healthy = False  # the health monitor brings it back


async def generate(gateway: Gateway, request: GenerationRequest, decision: Decision,
                   pools: list[Pool]) -> tuple[Lease, Generation]:
    """Non-streaming dispatch; the returned lease is already released."""
    error: GatewayError = NoHealthyWorker(
        f"no healthy worker in pool {decision.pool!r}", code="no_healthy_worker")
    for pool, worker, attempt in _candidates(gateway, pools, decision):
        lease = _lease(pool, worker, attempt)
        adapter = gateway.adapters[pool.config.engine]
        try:
            return lease, await adapter.generate(worker.url, request, pool.config, attempt.k)
        except UpstreamUnavailable as exc:
            _note_failure(worker, exc)
            error = exc
        finally:
            lease.release()
    raise error


async def open_stream(gateway: Gateway, request: GenerationRequest, decision: Decision,
                      pools: list[Pool]
                      ) -> tuple[Lease, StreamItem, AsyncIterator[StreamItem]]:
    """Start a stream and wait for its first item; the caller releases the lease."""
    error: GatewayError = NoHealthyWorker(
        f"no healthy worker in pool {decision.pool!r}", code="no_healthy_worker")
    for pool, worker, attempt in _candidates(gateway, pools, decision):
        lease = _lease(pool, worker, attempt)
        items = gateway.adapters[pool.config.engine].stream(
            worker.url, request, pool.config, attempt.k)
        try:
            first = await anext(items)
        except UpstreamUnavailable as exc:
            _note_failure(worker, exc)
            error = exc
        except BaseException:
            lease.release()
            await items.aclose()  # type: ignore[attr-defined]
            raise
        else:
            return lease, first, items
        lease.release()
        await items.aclose()  # type: ignore[attr-defined]
    raise error


def record(gateway: Gateway, *, request: GenerationRequest, profile: RequestProfile,
           tenant: TenantConfig, decision: Decision, load: int, timer: Timer, usage: Usage,
           spec: SpecStats, ok: bool) -> None:
    """Report one finished request to the recorder and as one OpenTelemetry span."""
    end = time.perf_counter()
    first = timer.first_token or end
    tokens = usage.completion_tokens
    itl = (end - first) / (tokens - 1) if tokens > 1 else 0.0
    accept = spec.accept_length or (1.0 if decision.k == 0 and ok else 0.0)
    entry = RequestRecord(
        model=request.model, pool=decision.pool, method=decision.method, k=decision.k,
        task=profile.task, temperature_bucket=profile.temperature_bucket,
        prompt_tokens=usage.prompt_tokens, output_tokens=tokens,
        verify_steps=spec.verify_steps or (tokens if accept == 1.0 else 0),
        accept_length=accept, load=load,
        ttft_s=first - timer.start, itl_s=itl, e2e_s=end - timer.start,
        tenant=tenant.name, ok=ok, timestamp=time.time(),
        slo_met=ok and (first - timer.start) * 1000 <= tenant.slo_ttft_ms
        and itl * 1000 <= tenant.slo_tpot_ms,
    )
    gateway.recorder.record(entry)
    span = gateway.tracer.start_span(f"specroute {request.endpoint}",
                                     start_time=time.time_ns() - int((end - timer.start) * 1e9))
    span.set_attributes(span_attributes(entry))
    span.end()

