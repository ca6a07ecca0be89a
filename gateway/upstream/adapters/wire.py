"""HTTP to the workers on the request path, errors mapped at this boundary.

The calls go through `gateway.upstream.http1.Http1Client` (kept connections, a fraction
of the CPU aiohttp's client spent a call: docs/PERFORMANCE.md). Everything it can raise
is translated here into `gateway.errors`; nothing above this module sees a transport
exception.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import orjson

from gateway.errors import (
    GatewayError,
    UpstreamProtocolError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnavailable,
)
from gateway.telemetry.spans import UPSTREAM_TRACE_HEADERS
from gateway.upstream.adapters.base import worker_auth
from gateway.upstream.http1 import Http1Client, Response
from gateway.upstream.transport_errors import (
    ConnectFailed,
    ConnectTimeout,
    HttpError,
    ReadTimeout,
    TooLarge,
)

MAX_SSE_LINE = 64 * 1024 * 1024  # SGLang's cumulative stream text can make long lines


def upstream_message(raw: bytes) -> str:
    """Pull a human message out of whatever error body the worker sent."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode(errors="replace").strip()[:500] or "no message"
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if error.get(key):
                    return str(error[key])
        if isinstance(error, str):
            return error
        if body.get("detail"):
            return str(body["detail"])
    return str(body)[:500]


def status_error(worker: str, status: int, raw: bytes) -> GatewayError:
    message = upstream_message(raw)
    if 400 <= status < 500:
        return UpstreamRejected(message, status=status, code="upstream_rejected")
    return UpstreamUnavailable(f"worker {worker} answered {status}: {message}",
                               status=503 if status == 503 else 502, code="upstream_error")


def transport_error(worker: str, exc: HttpError) -> GatewayError:
    """Map a transport failure to the exception tree. A connect timeout is apart: the
    worker never had the request, so it is always retried (gateway.upstream.dispatch);
    after a read or total timeout it may still be generating."""
    if isinstance(exc, ConnectTimeout):
        return UpstreamTimeout(f"cannot connect to worker {worker} in time",
                               code="upstream_connect_timeout")
    if isinstance(exc, ReadTimeout):
        return UpstreamTimeout(f"worker {worker} timed out ({exc})", code="upstream_timeout")
    if isinstance(exc, TooLarge):
        return UpstreamTooLarge(f"the worker's answer was too large: {exc}; ask for less "
                                f"(n, max_tokens, logprobs) or stream it",
                                code="upstream_response_too_large")
    if isinstance(exc, ConnectFailed):
        return UpstreamUnavailable(f"cannot connect to worker {worker}",
                                   code="upstream_connect_error")
    return UpstreamUnavailable(f"worker {worker} failed: {type(exc).__name__}: {exc}",
                               code="upstream_error")


@asynccontextmanager
async def post(client: Http1Client, worker: str, path: str, payload: dict,
               api_key: str | None = None, deadline: float | None = None
               ) -> AsyncIterator[Response]:
    """POST JSON (with the pool's `api_key` as a Bearer key); yield the response once it
    is known to be 200. The exchange ends by `deadline` (`Http1Client.request`). Leaving the block before the answer's end drops the connection:
    the worker sees the client leave."""
    trace = UPSTREAM_TRACE_HEADERS.get()  # W3C traceparent (gateway/telemetry/spans.py)
    headers = {**(trace or {}), **worker_auth(api_key)} if api_key else trace
    try:
        resp = await client.request("POST", worker, path, orjson.dumps(payload),
                                    headers or None, deadline=deadline)
    except HttpError as exc:
        raise transport_error(worker, exc) from exc
    try:
        if resp.status != 200:
            try:
                raw = await resp.read()
            except HttpError:
                raw = b""
            raise status_error(worker, resp.status, raw)
        try:
            yield resp
        except HttpError as exc:
            raise transport_error(worker, exc) from exc
    finally:
        resp.close()


async def answers(client: Http1Client, worker: str, timeout_s: float) -> bool:
    """Whether the worker's HTTP server answers at all (`GET /health`, any status)
    within `timeout_s`: alive, if perhaps busy. A hung or dead process does not."""
    try:
        resp = await client.request("GET", worker, "/health", total_s=timeout_s)
    except HttpError:
        return False
    resp.close()
    return True


async def post_json(client: Http1Client, worker: str, path: str, payload: dict,
                    api_key: str | None = None, deadline: float | None = None) -> dict:
    async with post(client, worker, path, payload, api_key, deadline) as resp:
        raw = await resp.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(worker, "the body is not JSON") from exc
    if not isinstance(body, dict):
        raise UpstreamProtocolError(worker, "the body is not a JSON object")
    return body


async def sse_data(worker: str, resp: Response) -> AsyncGenerator[dict, None]:
    """Yield each `data:` JSON object of an SSE stream until `data: [DONE]`.

    Events with a name (SGLang's `event: sglext_ids`) are skipped; an in-band
    `{"error": ...}` object (SGLang's way to fail mid-stream) raises.
    """
    event = ""
    try:
        while True:
            line = await resp.readline(MAX_SSE_LINE)
            if not line:
                return
            line = line.strip()
            if not line:
                event = ""
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode(errors="replace")
            elif line.startswith(b"data:") and not event:
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                item = orjson.loads(data)
                if not isinstance(item, dict):
                    raise UpstreamProtocolError(worker, "an SSE event is not a JSON object")
                if item.get("error"):
                    raise UpstreamUnavailable(
                        f"worker {worker} failed mid-stream: "
                        f"{upstream_message(orjson.dumps(item))}", code="upstream_error")
                yield item
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(worker, "an SSE event is not JSON") from exc
    except HttpError as exc:
        raise transport_error(worker, exc) from exc
