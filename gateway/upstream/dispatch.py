"""Dispatch: run a routed request on a worker, failing over before the first token.

The order of tries is: the chosen pool's best available worker, its other available
workers, then the pools after it in the router's order (the policy's fallbacks, plain
pools last), at most `server.max_attempts` workers in all; a stream's first token must
come within `server.first_token_timeout_s`. Failures that say nothing
about the request itself are retried: connection errors, timeouts, 5xx, replies of the
wrong shape. A worker's 4xx is final. So is the read timeout of a non-streamed request
on a worker that still answers (`alive`): it was generating, and another worker would
start it over from scratch (issue 24: a runaway tool call ran 300 s, then 300 s again);
a worker that no longer answers is known dead, and then the request is retried. The
whole of a request, failover included, ends at `server.total_timeout_s`: with a 504
if no token was sent yet, else the stream is ended (`gateway.http.endpoints`). Every
request gets a token budget first (`gateway.upstream.budget`). Once a stream's first
token has arrived the client owns that worker's answer: no retry can happen after
tokens were sent. Every outcome feeds the worker's
circuit breaker (`gateway.pools`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace

from gateway.config import ServerConfig
from gateway.errors import GatewayError, NoHealthyWorker, UpstreamTimeout, UpstreamUnavailable
from gateway.pools import Pool, Worker, served
from gateway.schemas import GenerationRequest
from gateway.telemetry.spans import NO_TRACE, Trace
from gateway.upstream.adapters.base import Adapter, Delta, GenerationResult, StreamItem
from gateway.upstream.budget import with_budget
from policies.types import Decision

log = logging.getLogger("specroute.gateway")


@dataclass(slots=True)
class Lease:
    """One worker serving one request; `release()` gives the slot back exactly once."""

    pool: Pool
    worker: Worker
    decision: Decision
    load: int
    workers: int = 1  # available workers in the pool at dispatch
    warnings: list[tuple[bytes, bytes]] = field(default_factory=list)  # response headers
    released: bool = False
    deadline: float = math.inf  # time.monotonic() a stream must end by (total_timeout_s)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.worker.outstanding -= 1

    def succeeded(self) -> None:
        self.worker.served(time.monotonic())

    def failed(self, exc: GatewayError) -> None:
        """Count a failure against the worker; connection refused opens its breaker. A
        worker's own 503 says it is full, not broken: the request goes on to another
        worker, the breaker is left alone (a burst of traffic would open every breaker
        of a busy pool)."""
        log.info("worker %s of pool %s failed: %s", self.worker.url, self.pool.name,
                 exc.message)
        if exc.status == 503 and exc.code == "upstream_error":
            return
        hard = exc.code == "upstream_connect_error"
        self.worker.breaker.failure(time.monotonic(), hard=hard)


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


def _lease(pool: Pool, worker: Worker, decision: Decision,
           request: GenerationRequest) -> Lease:
    load, workers = pool.outstanding, pool.healthy_workers
    worker.outstanding += 1
    worker.breaker.begin(time.monotonic())
    return Lease(pool, worker, decision, load, workers, warning_headers(request, pool))


def no_worker(decision: Decision) -> NoHealthyWorker:
    return NoHealthyWorker(f"no healthy worker in pool {decision.pool!r}",
                           code="no_healthy_worker")


def expired(total_s: float) -> UpstreamTimeout:
    return UpstreamTimeout(f"no answer within server.total_timeout_s ({total_s:g} s)",
                           code="upstream_timeout")


RETRYABLE = (UpstreamUnavailable, UpstreamTimeout)
ALIVE_PROBE_S = 2.0  # at most this long to ask a timed-out worker whether it answers


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


@dataclass(slots=True)
class Dispatcher:
    """Runs a routed request on its pools' workers through their engines' adapters."""

    adapters: dict[str, Adapter]  # by engine
    server: ServerConfig  # max_attempts, the timeouts, default_max_tokens

    def prepare(self, request: GenerationRequest, pool: Pool) -> GenerationRequest:
        """The request as this pool's worker gets it: format, then token budget."""
        return with_budget(for_pool(request, pool), pool, self.server.default_max_tokens)

    async def generate(self, request: GenerationRequest, decision: Decision,
                       pools: list[Pool], trace: Trace = NO_TRACE
                       ) -> tuple[Lease, GenerationResult]:
        """Non-streaming dispatch within `total_timeout_s`; the returned lease is already
        released. The deadline goes down to the HTTP client, whose read timer enforces
        it (no timer of its own here): past it, the try ends in an `UpstreamTimeout`,
        and the deadline is checked before each step, so no other try follows."""
        total = self.server.total_timeout_s
        deadline = time.monotonic() + total
        error: GatewayError | None = None
        for pool, worker, attempt in self._candidates(pools, decision):
            if time.monotonic() >= deadline:
                raise expired(total)
            lease = _lease(pool, worker, attempt, request)
            adapter = self.adapters[pool.config.engine]
            try:
                with trace.upstream(worker.url, pool.name, attempt.k):
                    result = await adapter.generate(
                        worker.url, self.prepare(request, pool), pool.config, attempt.k,
                        deadline)
            except RETRYABLE as exc:
                lease.failed(exc)
                error = exc
                if time.monotonic() >= deadline:  # the deadline itself
                    raise expired(total) from exc
                if await self._was_generating(adapter, worker, exc, deadline):
                    raise UpstreamTimeout(
                        f"worker {worker.url} timed out (server.read_timeout_s, "
                        f"{self.server.read_timeout_s:g} s) while still generating; not "
                        f"retried from scratch: set max_tokens lower or stream",
                        code="upstream_timeout") from exc
            except GatewayError:
                lease.succeeded()  # the worker answered: a 4xx is about the request
                raise
            else:
                lease.succeeded()
                return lease, result
            finally:
                lease.release()
        if time.monotonic() >= deadline:
            raise expired(total)
        raise error or no_worker(decision)

    async def _was_generating(self, adapter: Adapter, worker: Worker, exc: GatewayError,
                              deadline: float) -> bool:
        """A read or total timeout (not a connect one) on a worker that still answers."""
        if not isinstance(exc, UpstreamTimeout) or exc.code != "upstream_timeout":
            return False
        probe_s = min(ALIVE_PROBE_S, self.server.connect_timeout_s,
                      deadline - time.monotonic())
        return probe_s > 0 and worker.healthy and await adapter.alive(worker.url, probe_s)

    async def open_stream(self, request: GenerationRequest, decision: Decision,
                          pools: list[Pool], trace: Trace = NO_TRACE
                          ) -> tuple[Lease, StreamItem, AsyncIterator[StreamItem]]:
        """Start a stream and wait for its first item; the caller releases the lease and
        ends the stream at `lease.deadline`: `total_timeout_s` after this call, failover
        to the first token included (a 504 if it passes before that token)."""
        total = self.server.total_timeout_s
        deadline = time.monotonic() + total
        error: GatewayError | None = None
        for pool, worker, attempt in self._candidates(pools, decision):
            if (left := deadline - time.monotonic()) <= 0:
                break
            lease = _lease(pool, worker, attempt, request)
            lease.deadline = deadline
            items = self.adapters[pool.config.engine].stream(
                worker.url, self.prepare(request, pool), pool.config, attempt.k)
            try:
                with trace.upstream(worker.url, pool.name, attempt.k):  # to the first token
                    first = await first_item(items, worker.url,
                                             min(self.server.first_token_timeout_s, left))
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
        if time.monotonic() >= deadline:
            raise UpstreamTimeout(f"no first token within server.total_timeout_s ({total:g} s)",
                                  code="upstream_timeout")
        raise error or no_worker(decision)

    def _candidates(self, pools: list[Pool], decision: Decision
                    ) -> Iterator[tuple[Pool, Worker, Decision]]:
        tried: set[str] = set()
        attempts = 0
        for pool in pools:
            decision = served(decision, pool)  # a fallback pool runs its own method and k
            while attempts < self.server.max_attempts:
                worker = pool.pick(tried)
                if worker is None:
                    break
                tried.add(worker.url)
                attempts += 1
                yield pool, worker, decision
