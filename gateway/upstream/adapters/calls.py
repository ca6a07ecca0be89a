"""The calls to workers that are not streamed, and the mapping of the transport's errors
to the gateway's, at this boundary.

The calls go through `gateway.upstream.http1.Http1Client` (kept connections, a fraction
of the CPU aiohttp's client spent a call: docs/PERFORMANCE.md). Everything it can raise
is translated here into `gateway.errors`; nothing above the adapters sees a transport
exception. Plain coroutines, no async generator, so that mypyc compiles them
(`gateway/compiled.py`): a non-streamed request runs `post_json` and nothing of
`gateway.upstream.adapters.wire`, which holds the streamed side.
"""

from __future__ import annotations

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


async def post_ok(client: Http1Client, worker: str, path: str, payload: dict,
                  api_key: str | None = None, deadline: float | None = None) -> Response:
    """POST JSON (with the pool's `api_key` as a Bearer key) by `deadline`
    (`Http1Client.request`); the response once it is known to be 200, which the caller
    must `close()` (before the answer's end, that drops the connection: the worker sees
    the client leave). Any other status is raised as its error, the response closed."""
    trace = UPSTREAM_TRACE_HEADERS.get()  # W3C traceparent (gateway/telemetry/spans.py)
    headers = {**(trace or {}), **worker_auth(api_key)} if api_key else trace
    try:
        resp = await client.request("POST", worker, path, orjson.dumps(payload),
                                    headers or None, deadline=deadline)
    except HttpError as exc:
        raise transport_error(worker, exc) from exc
    if resp.status == 200:
        return resp
    try:
        raw = await resp.read()
    except HttpError:
        raw = b""
    finally:
        resp.close()
    raise status_error(worker, resp.status, raw)


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
    resp = await post_ok(client, worker, path, payload, api_key, deadline)
    try:
        raw = await resp.read()
    except HttpError as exc:
        raise transport_error(worker, exc) from exc
    finally:
        resp.close()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UpstreamProtocolError(worker, "the body is not JSON") from exc
    if not isinstance(body, dict):
        raise UpstreamProtocolError(worker, "the body is not a JSON object")
    return body
