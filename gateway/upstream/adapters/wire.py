"""HTTP to the workers: one shared aiohttp session, errors mapped at this boundary.

aiohttp rather than httpx because on this project's loopback measurements it adds
~0.45 ms less per upstream call (docs/GATEWAY.md, "What the proxy stack costs").
Everything aiohttp can raise is translated here into `gateway.errors`; nothing above
this module sees an aiohttp exception.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import orjson
from yarl import URL

from gateway.errors import (
    GatewayError,
    UpstreamProtocolError,
    UpstreamRejected,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.telemetry.spans import UPSTREAM_TRACE_HEADERS

MAX_SSE_LINE = 64 * 1024 * 1024  # SGLang's cumulative stream text can make long lines
JSON_HEADERS = {"Content-Type": "application/json"}


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


def transport_error(worker: str, exc: BaseException) -> GatewayError:
    """Map an aiohttp/asyncio failure to the exception tree. A connect timeout is apart:
    the worker never had the request, so it is always retried (gateway.upstream.dispatch);
    after a read or total timeout it may still be generating."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return UpstreamTimeout(f"cannot connect to worker {worker} in time",
                               code="upstream_connect_timeout")
    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(f"worker {worker} timed out", code="upstream_timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamUnavailable(f"cannot connect to worker {worker}",
                                   code="upstream_connect_error")
    return UpstreamUnavailable(f"worker {worker} failed: {type(exc).__name__}: {exc}",
                               code="upstream_error")


@functools.lru_cache(maxsize=4096)  # workers x paths; parsing a URL costs ~5 us a call
def endpoint_url(worker: str, path: str) -> URL:
    return URL(worker + path)


@asynccontextmanager
async def post(session: aiohttp.ClientSession, worker: str, path: str,
               payload: dict) -> AsyncIterator[aiohttp.ClientResponse]:
    """POST JSON; yield the response once it is known to be 200."""
    try:
        trace = UPSTREAM_TRACE_HEADERS.get()  # W3C traceparent (gateway/telemetry/spans.py)
        async with session.post(endpoint_url(worker, path), data=orjson.dumps(payload),
                                headers={**JSON_HEADERS, **trace} if trace else JSON_HEADERS
                                ) as resp:
            if resp.status != 200:
                raise status_error(worker, resp.status, await resp.read())
            try:
                yield resp
            except BaseException:
                resp.close()  # drop the connection: the worker sees the client leave
                raise
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise transport_error(worker, exc) from exc


async def answers(session: aiohttp.ClientSession, worker: str, timeout_s: float) -> bool:
    """Whether the worker's HTTP server answers at all (`GET /health`, any status)
    within `timeout_s`: alive, if perhaps busy. A hung or dead process does not."""
    try:
        async with session.get(endpoint_url(worker, "/health"),
                               timeout=aiohttp.ClientTimeout(total=timeout_s)):
            return True
    except (TimeoutError, aiohttp.ClientError):
        return False


async def post_json(session: aiohttp.ClientSession, worker: str, path: str,
                    payload: dict) -> dict:
    async with post(session, worker, path, payload) as resp:
        raw = await resp.read()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(worker, "the body is not JSON") from exc
    if not isinstance(body, dict):
        raise UpstreamProtocolError(worker, "the body is not a JSON object")
    return body


async def sse_data(worker: str, resp: aiohttp.ClientResponse) -> AsyncIterator[dict]:
    """Yield each `data:` JSON object of an SSE stream until `data: [DONE]`.

    Events with a name (SGLang's `event: sglext_ids`) are skipped; an in-band
    `{"error": ...}` object (SGLang's way to fail mid-stream) raises.
    """
    event = ""
    try:
        while True:
            line = await resp.content.readuntil(b"\n", max_size=MAX_SSE_LINE)
            if not line:
                return
            line = line.strip()
            if not line:
                event = ""
            elif line.startswith(b"event:"):
                event = line[6:].strip().decode()
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
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        raise transport_error(worker, exc) from exc
