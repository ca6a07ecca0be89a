"""The token routes (`/v1/chat/completions`, `/v1/completions`) as raw ASGI apps.

These run on every generated request, so they skip FastAPI's dependency and response
layers (shared/REFERENCES.md: raw ASGI + aiohttp added 0.20 ms p50 here, a FastAPI
route 0.29 ms and ~45% less throughput under concurrency). One request, in order:
authenticate → read the body (size-capped) → rate limit → parse JSON → validate →
classify → route → dispatch → respond → record. Every failure is a `GatewayError`,
turned into a response in exactly one place (`errors.error_body`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import orjson
from starlette.types import Receive, Scope, Send

from gateway import dispatch
from gateway.adapters.base import Final, SpecStats, StreamItem, Usage
from gateway.config import TenantConfig
from gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge, error_body
from gateway.responses import ChunkWriter, headers_for, response_body
from gateway.schemas import Endpoint, GenerationRequest, parse_request
from policies.types import Decision, RequestProfile

log = logging.getLogger("specroute.gateway")
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


async def send_once(send: Send, status: int, body: bytes,
                    headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*JSON, *headers, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int, content_length: int | None) -> bytes:
    too_large = PayloadTooLarge(f"Request body is larger than {limit} bytes",
                                code="request_too_large")
    if content_length is not None and content_length > limit:
        raise too_large
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise InvalidRequest("client disconnected", code="client_disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class TokenEndpoint:
    """ASGI app for one OpenAI generation route; the `Gateway` lives on app.state."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway: dispatch.Gateway = scope["app"].state.gateway
        timer = dispatch.Timer()
        try:
            tenant, request, profile, decision, pools = await self.admit(
                gateway, scope, receive)
        except GatewayError as exc:
            await send_once(send, exc.status, error_body(exc), [])
            return
        if request.stream:
            await self.stream(gateway, send, receive, timer, tenant, request, profile,
                              decision, pools)
        else:
            await self.complete(gateway, send, timer, tenant, request, profile, decision,
                                pools)

    async def admit(self, gateway: dispatch.Gateway, scope: Scope, receive: Receive
                    ) -> tuple[TenantConfig, GenerationRequest, RequestProfile, Decision, list]:
        authorization, content_length = None, None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"content-length" and value.isdigit():
                content_length = int(value)
        tenant = gateway.auth.tenant(authorization)
        raw = await read_body(receive, gateway.config.server.max_body_bytes, content_length)
        gateway.limiter.admit(tenant)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"The request body is not valid JSON: {exc}",
                                 code="invalid_json") from exc
        request = parse_request(body, self.endpoint)
        profile = gateway.router.classify(body, self.endpoint, tenant.name)
        decision, pools = gateway.router.route(request, profile)
        return tenant, request, profile, decision, pools

    async def complete(self, gateway: dispatch.Gateway, send: Send, timer: dispatch.Timer,
                       tenant: TenantConfig, request: GenerationRequest,
                       profile: RequestProfile, decision: Decision, pools: list) -> None:
        usage, spec, ok, load = Usage(), SpecStats(), False, 0
        try:
            lease, result = await dispatch.generate(gateway, request, decision, pools)
            timer.token()
            decision, load, usage, spec, ok = (lease.decision, lease.load, result.usage,
                                               result.spec, True)
            await send_once(send, 200, response_body(request, result, decision),
                            headers_for(decision))
        except GatewayError as exc:
            await send_once(send, exc.status, error_body(exc), [])
        finally:
            dispatch.record(gateway, request=request, profile=profile, tenant=tenant,
                            decision=decision, load=load, timer=timer, usage=usage,
                            spec=spec, ok=ok)

    async def stream(self, gateway: dispatch.Gateway, send: Send, receive: Receive,
                     timer: dispatch.Timer, tenant: TenantConfig, request: GenerationRequest,
                     profile: RequestProfile, decision: Decision, pools: list) -> None:
        try:
            lease, first, items = await dispatch.open_stream(gateway, request, decision, pools)
        except GatewayError as exc:
            await send_once(send, exc.status, error_body(exc), [])
            dispatch.record(gateway, request=request, profile=profile, tenant=tenant,
                            decision=decision, load=0, timer=timer, usage=Usage(),
                            spec=SpecStats(), ok=False)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*SSE, *headers_for(lease.decision)]})
        disconnected = asyncio.ensure_future(receive())  # completes on client disconnect
        final: Final | None = None
        try:
            final = await self.relay(send, ChunkWriter(request, lease.decision), first, items,
                                     timer, disconnected)
        finally:
            lease.release()
            disconnected.cancel()
            await items.aclose()  # type: ignore[attr-defined]
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            dispatch.record(gateway, request=request, profile=profile, tenant=tenant,
                            decision=lease.decision, load=lease.load, timer=timer,
                            usage=final.usage if final else Usage(),
                            spec=final.spec if final else SpecStats(), ok=final is not None)

    async def relay(self, send: Send, writer: ChunkWriter, item: StreamItem,
                    items: AsyncIterator[StreamItem], timer: dispatch.Timer,
                    disconnected: asyncio.Future) -> Final | None:
        """Forward items as SSE until the `Final` one; None if the stream broke off."""
        try:
            while not isinstance(item, Final):
                if disconnected.done():
                    return None  # closing `items` aborts the upstream request
                if item.text or item.extra:
                    timer.token()
                    await send({"type": "http.response.body", "body": writer.delta(item),
                                "more_body": True})
                item = await anext(items)
        except GatewayError as exc:
            log.warning("stream failed after it started: %s", exc.message)
            await send({"type": "http.response.body", "body": writer.error(exc.body()),
                        "more_body": True})
            return None
        except StopAsyncIteration:
            return None
        await send({"type": "http.response.body", "body": writer.final(item),
                    "more_body": True})
        return item
