"""The token routes (`/v1/chat/completions`, `/v1/completions`) and
`/v1/routing/explain` as raw ASGI apps.

These run on every generated request, so they skip FastAPI's dependency and response
layers (measured on the 2-core dev box: raw ASGI + aiohttp added 0.20 ms p50, a FastAPI
route 0.29 ms and ~45% less throughput under concurrency; docs/GATEWAY.md, "What the
proxy stack costs"). One request, in order: authenticate → read the body (size-capped,
time-capped) → rate limit → parse JSON → validate → classify → route → dispatch →
respond → record.
Every failure is a `GatewayError`, turned into a response in exactly one place
(`errors.error_body`). A client that disconnects cancels the work at once (the upstream
connection is closed, so the worker frees its slot); explain runs the same steps up to
the route and stops there (rate limit included: explain costs a classification).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import orjson
from starlette.types import Receive, Scope, Send

from gateway.config import TenantConfig
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
    error_body,
    internal_error,
    retry_after,
    shutting_down,
)
from gateway.http.disconnect import WATCH_AFTER_S, DisconnectWatch
from gateway.http.responses import ChunkWriter, headers_for, response_body
from gateway.http.services import Gateway
from gateway.pools import Pool
from gateway.routing.router import Pin
from gateway.schemas import Endpoint, GenerationRequest, parse_request
from gateway.telemetry.record import Outcome, Timer
from gateway.telemetry.spans import NO_TRACE, Trace, request_attributes, start_request
from gateway.tenants.auth import authorize
from gateway.upstream.adapters.base import Final, GenerationResult, StreamItem
from gateway.upstream.dispatch import Lease, warning_headers
from policies.types import Decision, RequestProfile

log = logging.getLogger("specroute.gateway")
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def send_once(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON, *headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int, content_length: int | None,
                    timeout_s: float) -> bytes:
    """The whole body, at most `limit` bytes, within `timeout_s` of the headers: a client
    trickling its body (slow loris) gets a 408 instead of holding the connection."""
    def too_large() -> PayloadTooLarge:  # built only when raised
        return PayloadTooLarge(f"Request body is larger than {limit} bytes",
                               code="request_too_large")

    if content_length is not None and content_length > limit:
        raise too_large()
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise InvalidRequest("client disconnected", code="client_disconnected")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise too_large()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError as exc:
        raise RequestTimeout(f"The request body did not arrive within {timeout_s:g} s",
                             code="request_timeout") from exc


def content_length(value: bytes | None) -> int | None:
    """The declared length; None when absent or not plain digits (the server's parser
    has the last word on those). Past 18 digits `int` would be slow or refuse (Python's
    4300-digit limit), and any such length is over every body limit anyway."""
    if value is None or not value.isdigit():
        return None
    return int(value) if len(value) <= 18 else 10**18


def check_media_type(value: bytes | None) -> None:
    """JSON or nothing (curl without -H, httpx `content=`); anything else is a 415
    rather than a confusing JSON error."""
    if value is None:
        return
    media = value.split(b";", 1)[0].strip().lower()
    if media != b"application/json" and not media.endswith(b"+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {value.decode('latin-1')[:100]!r}",
            param="content-type", code="unsupported_media_type")


async def send_error(send: Send, exc: GatewayError) -> None:
    """The error answer; after a 408 the connection is closed, since the rest of the
    slow body may still be on its way."""
    close = [(b"connection", b"close")] if isinstance(exc, RequestTimeout) else []
    if (after := retry_after(exc)) is not None:
        close.append((b"retry-after", after.encode()))
    await send_once(send, exc.status, error_body(exc), close)


@dataclass(slots=True)
class Admitted:
    """A request that passed every check and has a route."""

    tenant: TenantConfig
    request: GenerationRequest
    profile: RequestProfile
    decision: Decision
    pools: list[Pool]
    trace: Trace = NO_TRACE

    def outcome(self, timer: Timer, lease: Lease,
                done: GenerationResult | Final | None) -> Outcome:
        """What the request came to on `lease`; `done`: what the worker finished with
        (None: no answer). Built in one go: `dataclasses.replace` costs ~5 us."""
        if done is None:
            return Outcome(self.request, self.profile, self.tenant, lease.decision, timer,
                           lease.load, lease.workers)
        return Outcome(self.request, self.profile, self.tenant, lease.decision, timer,
                       lease.load, lease.workers, done.usage, done.spec, True,
                       done.finish_reason)


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name: value for name, value in scope["headers"]
            if name in (b"authorization", b"content-length", b"content-type",
                        b"x-specroute-pool", b"x-specroute-k", b"x-specroute-benchmark")}


async def read_request(gateway: Gateway, scope: Scope, receive: Receive,
                       trace: Trace = NO_TRACE) -> tuple[TenantConfig, dict, Pin]:
    """Authenticate, check the media type, read the body (size- and time-capped), rate
    limit, parse JSON, read pins."""
    headers = _headers(scope)
    authorization = headers.get(b"authorization")
    with trace.phase("authenticate"):
        tenant = gateway.auth.tenant(authorization.decode("latin-1") if authorization
                                     else None)
    trace.set("specroute.tenant", tenant.name)
    scope["specroute.tenant"] = tenant.name  # for the access log
    check_media_type(headers.get(b"content-type"))
    server = gateway.config.server
    raw = await read_body(receive, server.max_body_bytes,
                          content_length(headers.get(b"content-length")),
                          server.body_timeout_s)
    with trace.phase("rate limit"):
        await gateway.limits.admit(tenant)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}",
                             code="invalid_json") from exc
    pool, k = headers.get(b"x-specroute-pool"), headers.get(b"x-specroute-k")
    benchmark = headers.get(b"x-specroute-benchmark")
    pin = Pin.from_headers(pool.decode("latin-1") if pool else None,
                           k.decode("latin-1") if k is not None else None,
                           benchmark.decode("latin-1") if benchmark is not None else None)
    return tenant, body, pin


class TokenEndpoint:
    """ASGI app for one OpenAI generation route; the `Gateway` lives on app.state."""

    def __init__(self, endpoint: Endpoint, route: str | None = None) -> None:
        self.endpoint = endpoint
        self.route = route or endpoint  # the span's name (gateway.http.sglang_routes: "generate")

    def parse(self, gateway: Gateway, body: object) -> GenerationRequest:
        return parse_request(body, self.endpoint)

    def render(self, request: GenerationRequest, result: GenerationResult,
               decision: Decision) -> bytes:
        return response_body(request, result, decision)

    def writer(self, request: GenerationRequest, decision: Decision) -> ChunkWriter:
        return ChunkWriter(request, decision)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway: Gateway = scope["app"].state.gateway
        timer = Timer()
        trace = start_request(gateway.tracer, gateway.provider, scope["headers"],
                              self.route)
        try:
            tenant, body, pin = await read_request(gateway, scope, receive, trace)
            request = self.parse(gateway, body)
            request_attributes(trace, request, gateway.config.server.otel_capture_content)
            authorize(tenant, request, pin)
            with trace.phase("classify"):
                profile = gateway.router.classify(request, tenant.name)
            with trace.phase("decide"):
                decision, pools = gateway.router.route(request, profile, pin)
        except GatewayError as exc:
            trace.fail(exc.status, exc.code)
            await send_error(send, exc)
            return
        admitted = Admitted(tenant, request, profile, decision, pools, trace)
        serve = self.stream if request.stream else self.complete
        watch = DisconnectWatch(receive, WATCH_AFTER_S)
        ticket = None
        try:
            if gateway.admission is not None:
                try:
                    with trace.phase("queue wait"):
                        ticket = await gateway.admission.enter(decision.pool, tenant,
                                                               timer.start)
                except GatewayError as exc:  # shed under overload: 429 + Retry-After
                    trace.fail(exc.status, exc.code)
                    await send_error(send, exc)
                    return
                trace.set("specroute.queued_ms", round(ticket.queued_s * 1000, 3))
            await serve(gateway, send, timer, admitted)
        except asyncio.CancelledError:
            if not watch.fired:
                raise  # cancelled from outside, not by the client leaving
            log.info("client disconnected; upstream request cancelled")
        finally:
            watch.close()
            if ticket is not None:
                gateway.admission.leave(ticket)  # type: ignore[union-attr]

    async def complete(self, gateway: Gateway, send: Send, timer: Timer,
                       job: Admitted) -> None:
        outcome = Outcome(job.request, job.profile, job.tenant, job.decision, timer)
        try:
            lease, result = await gateway.dispatcher.generate(job.request, job.decision,
                                                              job.pools, job.trace)
            timer.token()
            outcome = job.outcome(timer, lease, result)
            await send_once(send, 200, self.render(job.request, result, lease.decision),
                            headers_for(lease.decision) + warning_headers(job.request,
                                                                          lease.pool))
        except GatewayError as exc:
            job.trace.set("http.response.status_code", exc.status)
            await send_error(send, exc)
        finally:
            gateway.reporter.record(outcome, job.trace)

    async def stream(self, gateway: Gateway, send: Send, timer: Timer,
                     job: Admitted) -> None:
        outcome = Outcome(job.request, job.profile, job.tenant, job.decision, timer)
        try:
            lease, first, items = await gateway.dispatcher.open_stream(
                job.request, job.decision, job.pools, job.trace)
        except GatewayError as exc:
            job.trace.set("http.response.status_code", exc.status)
            await send_error(send, exc)
            gateway.reporter.record(outcome, job.trace)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*SSE, *headers_for(lease.decision),
                                *warning_headers(job.request, lease.pool)]})
        final: Final | None = None
        try:
            final = await self.relay(send, self.writer(job.request, lease.decision), first,
                                     items, timer, lease)
        finally:
            lease.release()
            await items.aclose()  # type: ignore[attr-defined]  # closes the upstream
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            gateway.reporter.record(job.outcome(timer, lease, final), job.trace)

    async def relay(self, send: Send, writer: ChunkWriter, item: StreamItem,
                    items: AsyncIterator[StreamItem], timer: Timer,
                    lease: Lease) -> Final | None:
        """Forward items as SSE until the `Final` one; None if the stream broke off or
        reached `lease.deadline` (server.total_timeout_s): then it ends the way a
        max_tokens cut does, `finish_reason: "length"` (`ChunkWriter.cut`), and the
        caller closes the upstream, which frees the worker's slot."""
        left = lease.deadline - time.monotonic()
        try:
            async with asyncio.timeout(left if left < math.inf else None):
                while not isinstance(item, Final):
                    if body := writer.delta(item):
                        timer.token()
                        await send({"type": "http.response.body", "body": body,
                                    "more_body": True})
                    item = await anext(items)
        except TimeoutError:
            await self.cut(send, writer, lease)
            return None
        except GatewayError as exc:
            if time.monotonic() >= lease.deadline:  # aiohttp's own total timer won the race
                await self.cut(send, writer, lease)
                return None
            log.warning("stream failed after it started: %s", exc.message)
            lease.failed(exc)
            await send({"type": "http.response.body", "body": writer.error(exc.body()),
                        "more_body": True})
            return None
        except StopAsyncIteration:
            return None
        except asyncio.CancelledError:  # the drain at shutdown ended (or the client left)
            await send({"type": "http.response.body", "more_body": True,
                        "body": writer.error(shutting_down().body())})
            raise
        except Exception as exc:  # noqa: BLE001 - a bug: the client still gets an event
            error = internal_error(exc, "stream relay")
            await send({"type": "http.response.body", "body": writer.error(error.body()),
                        "more_body": True})
            return None
        await send({"type": "http.response.body", "body": writer.final(item),
                    "more_body": True})
        return item

    @staticmethod
    async def cut(send: Send, writer: ChunkWriter, lease: Lease) -> None:
        log.info("stream on worker %s ended at server.total_timeout_s", lease.worker.url)
        await send({"type": "http.response.body", "more_body": True,
                    "body": writer.cut("server.total_timeout_s")})


class ExplainEndpoint:
    """`POST /v1/routing/explain`: the profile, the decision and every pool's
    eligibility for a chat or completions body, without generating anything."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway: Gateway = scope["app"].state.gateway
        try:
            tenant, body, pin = await read_request(gateway, scope, receive)
            endpoint: Endpoint = "chat" if isinstance(body, dict) and "messages" in body \
                else "completions"
            if isinstance(body, dict) and "messages" not in body and "prompt" not in body:
                raise InvalidRequest("give 'messages' (chat) or 'prompt' (completions)",
                                     param="messages", code="invalid_value")
            request = parse_request(body, endpoint)
            authorize(tenant, request, pin)
            profile = gateway.router.classify(request, tenant.name)
            assessed = gateway.router.assess(request, profile, pin)
            decision, pools = gateway.router.route_assessed(assessed, profile, pin,
                                                            explain=True)
        except GatewayError as exc:
            await send_error(send, exc)
            return
        warnings = warning_headers(request, pools[0])
        answer = {"endpoint": endpoint, "profile": profile.to_dict(),
                  "tenant": {"name": tenant.name, "priority": tenant.priority,
                             "slo_ttft_ms": tenant.slo_ttft_ms,
                             "slo_tpot_ms": tenant.slo_tpot_ms},
                  "decision": decision.to_dict(), "order": [p.name for p in pools],
                  "predictions": gateway.router.predictions(assessed, profile, pin),
                  "candidates": [a.to_dict() for a in assessed],
                  "warnings": [value.decode() for _, value in warnings]}
        await send_once(send, 200, orjson.dumps(answer), headers_for(decision) + warnings)
