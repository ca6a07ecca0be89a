"""The token routes (`/v1/chat/completions`, `/v1/completions`) and
`/v1/routing/explain` as raw ASGI apps.

These run on every generated request, so they skip FastAPI's dependency and response
layers, which cost latency and much throughput under concurrency (docs/GATEWAY.md, "What
the proxy stack costs"). One request, in order: authenticate → read the body (size-capped,
time-capped) → the routing core's admission (`gateway.core.admit`: rate limit, parse
JSON, pins, validate, authorize, classify, route) → queue for the pool's slots →
dispatch → respond → record.
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
from collections.abc import AsyncIterator, Callable
from functools import partial

import orjson
from starlette.types import Receive, Scope, Send

from gateway.config import ServerConfig, TenantConfig
from gateway.core.admit import Admitted, admit
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    RequestTimeout,
    error_body,
    internal_error,
    retry_after,
    shutting_down,
)
from gateway.http.bodies import check_media_type, content_length, read_body
from gateway.http.disconnect import WATCH_AFTER_S, ClientStalled, DisconnectWatch, TimedSend
from gateway.http.gateway import Gateway
from gateway.http.responses import ChunkWriter, headers_for, response_body
from gateway.http.tally import StreamTally
from gateway.schemas import Endpoint, GenerationRequest, parse_forwardable, parse_request
from gateway.telemetry.record import Outcome, Timer
from gateway.telemetry.spans import NO_TRACE, Trace, start_request
from gateway.upstream.adapters.base import Final, GenerationResult, StreamItem
from gateway.upstream.dispatch import Lease, warning_headers
from policies.types import Decision

log = logging.getLogger("specroute.gateway")
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def send_once(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON, *headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: GatewayError) -> None:
    """The error answer; after a 408 the connection is closed, since the rest of the
    slow body may still be on its way."""
    close = [(b"connection", b"close")] if isinstance(exc, RequestTimeout) else []
    if (after := retry_after(exc)) is not None:
        close.append((b"retry-after", after.encode()))
    await send_once(send, exc.status, error_body(exc), close)


PINS = {b"x-specroute-pool": "x-specroute-pool", b"x-specroute-k": "x-specroute-k",
        b"x-specroute-benchmark": "x-specroute-benchmark"}  # the headers `admit` reads


async def read_request(gateway: Gateway, scope: Scope, receive: Receive,
                       trace: Trace = NO_TRACE) -> tuple[TenantConfig, dict[str, str], bytes]:
    """Check the media type, authenticate, read the body (size- and time-capped): the
    tenant, the pin headers `admit` reads (by lowercase name) and the body. The media
    type and the length are read as the bytes they came in; of a repeated header, the
    last one counts."""
    media: bytes | None = None
    declared: bytes | None = None
    authorization: bytes | None = None
    pins: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name == b"content-type":
            media = value
        elif name == b"authorization":
            authorization = value
        elif name == b"content-length":
            declared = value
        elif name in PINS:
            pins[PINS[name]] = value.decode("latin-1")
    check_media_type(media)
    with trace.phase("authenticate"):
        tenant = gateway.auth.tenant(None if authorization is None
                                     else authorization.decode("latin-1"))
    trace.set("specroute.tenant", tenant.name)
    scope["specroute.tenant"] = tenant.name  # for the access log
    server = gateway.config.server
    raw = await read_body(receive, server.max_body_bytes, content_length(declared),
                          server.body_timeout_s, gateway.clock)
    return tenant, pins, raw


def outcome(job: Admitted, timer: Timer, lease: Lease | None,
            done: GenerationResult | Final | None) -> Outcome:
    """What the request came to on `lease` (None: no worker took it); `done`: what the
    worker finished with (None: no answer)."""
    if lease is None:
        return Outcome(job.request, job.profile, job.tenant, job.decision, timer)
    if done is None:
        return Outcome(job.request, job.profile, job.tenant, lease.decision, timer,
                       lease.load, lease.workers)
    return Outcome(job.request, job.profile, job.tenant, lease.decision, timer, lease.load,
                   lease.workers, done.usage, done.spec, True, done.finish_reason)


class TokenEndpoint:
    """ASGI app for one OpenAI generation route; the `Gateway` lives on app.state."""

    def __init__(self, endpoint: Endpoint, route: str | None = None) -> None:
        self.endpoint = endpoint
        self.route = route or endpoint  # the span's name (gateway.http.sglang_routes: "generate")

    def parser(self, gateway: Gateway) -> Callable[[object], GenerationRequest]:
        """What validates this route's body: `parse_request`, then text content parts
        only (`check_content_parts`)."""
        return partial(parse_forwardable, endpoint=self.endpoint, server=gateway.config.server)

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
            tenant, headers, raw = await read_request(gateway, scope, receive, trace)
        except GatewayError as exc:
            trace.fail(exc.status, exc.code)
            await send_error(send, exc)
            return
        watch = DisconnectWatch(receive, gateway.clock, WATCH_AFTER_S)  # the client may leave
        job: Admitted | None = None
        try:
            try:
                job = await admit(gateway, tenant, headers, raw, self.parser(gateway), trace,
                                  queue=timer.start)  # shed under overload: 429 + Retry-After
            except GatewayError as exc:
                trace.fail(exc.status, exc.code)
                await send_error(send, exc)
                return
            serve = self.stream if job.request.stream else self.complete
            await serve(gateway, TimedSend(send, gateway.config.server.send_timeout_s,
                                           gateway.clock), timer, job)
        except asyncio.CancelledError:
            if not watch.fired:
                raise  # cancelled from outside, not by the client leaving
            log.info("client disconnected; upstream request cancelled")
        except ClientStalled as exc:  # the connection is left unfinished: uvicorn closes it
            log.info("response cut: %s", exc)
        finally:
            watch.close()
            if job is not None and job.ticket is not None:
                gateway.admission.leave(job.ticket)

    async def complete(self, gateway: Gateway, send: Send, timer: Timer,
                       job: Admitted) -> None:
        lease, result = None, None
        try:
            lease, result = await gateway.dispatcher.generate(job.request, job.decision,
                                                              job.pools, job.trace)
            timer.token()
            await send_once(send, 200, self.render(job.request, result, lease.decision),
                            headers_for(lease.decision) + lease.warnings)
        except GatewayError as exc:
            job.trace.set("http.response.status_code", exc.status)
            await send_error(send, exc)
        finally:
            gateway.reporter.record(outcome(job, timer, lease, result), job.trace)

    async def stream(self, gateway: Gateway, send: Send, timer: Timer,
                     job: Admitted) -> None:
        try:
            lease, first, items = await gateway.dispatcher.open_stream(
                job.request, job.decision, job.pools, job.trace)
        except GatewayError as exc:
            job.trace.set("http.response.status_code", exc.status)
            await send_error(send, exc)
            gateway.reporter.record(outcome(job, timer, None, None), job.trace)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*SSE, *headers_for(lease.decision), *lease.warnings]})
        final: Final | None = None
        tally = StreamTally(job.request)
        try:
            final = await self.relay(send, self.writer(job.request, lease.decision), first,
                                     items, timer, lease, tally)
        finally:
            if final is None:  # abandoned or cut: no worker usage comes, charge the tally
                gateway.limits.spend(job.tenant, tally.tokens)
            lease.release()
            await items.aclose()  # type: ignore[attr-defined]  # closes the upstream
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            gateway.reporter.record(outcome(job, timer, lease, final), job.trace)

    async def relay(self, send: Send, writer: ChunkWriter, item: StreamItem,
                    items: AsyncIterator[StreamItem], timer: Timer,
                    lease: Lease, tally: StreamTally | None = None) -> Final | None:
        """Forward items as SSE until the `Final` one (each counted in `tally`); None if
        the stream broke off or reached `lease.deadline` (server.total_timeout_s): then
        it ends the way a max_tokens cut does, `finish_reason: "length"`
        (`ChunkWriter.cut`), and the caller closes the upstream, which frees the
        worker's slot."""
        left = lease.deadline - time.monotonic()
        try:
            async with asyncio.timeout(left if left < math.inf else None):
                while not isinstance(item, Final):
                    if tally is not None:
                        tally.add(item)
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
        except ClientStalled:
            raise  # nothing more can reach this client
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

    @staticmethod
    def endpoint(body: object) -> Endpoint:
        return "chat" if isinstance(body, dict) and "messages" in body else "completions"

    def parse(self, body: object, server: ServerConfig) -> GenerationRequest:
        if isinstance(body, dict) and "messages" not in body and "prompt" not in body:
            raise InvalidRequest("give 'messages' (chat) or 'prompt' (completions)",
                                 param="messages", code="invalid_value")
        return parse_request(body, self.endpoint(body), server)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway: Gateway = scope["app"].state.gateway
        try:
            tenant, headers, raw = await read_request(gateway, scope, receive)
            job = await admit(gateway, tenant, headers, raw,
                              partial(self.parse, server=gateway.config.server), explain=True)
        except GatewayError as exc:
            await send_error(send, exc)
            return
        request, decision, pools = job.request, job.decision, job.pools
        assessed, profile = job.assessed or [], job.profile
        warnings = warning_headers(request, pools[0])
        answer = {"endpoint": self.endpoint(job.body), "profile": profile.to_dict(),
                  "tenant": {"name": tenant.name, "priority": tenant.priority,
                             "slo_ttft_ms": tenant.slo_ttft_ms,
                             "slo_tpot_ms": tenant.slo_tpot_ms},
                  "decision": decision.to_dict(), "order": [p.name for p in pools],
                  "predictions": gateway.router.predictions(assessed, profile, job.pin),
                  "candidates": [a.to_dict() for a in assessed],
                  "warnings": [value.decode() for _, value in warnings]}
        await send_once(send, 200, orjson.dumps(answer), headers_for(decision) + warnings)
