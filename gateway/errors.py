"""The gateway's one exception tree, and its one conversion to an HTTP response.

::

    GatewayError                      (500 api_error; only for bugs)
    ├── ClientError                   4xx: the request is at fault
    │   ├── InvalidRequest            400 invalid_request_error (names `param`)
    │   ├── AuthenticationFailed      401 authentication_error
    │   ├── PermissionDenied          403 permission_error (the tenant may not do this)
    │   ├── ModelNotFound             404 not_found_error
    │   ├── RequestTimeout            408 invalid_request_error (body not sent in time)
    │   ├── PayloadTooLarge           413 invalid_request_error
    │   ├── MisdirectedRequest        421 invalid_request_error (a Host not allowed)
    │   ├── UnsupportedMediaType      415 invalid_request_error
    │   └── RateLimited               429 rate_limit_error (with Retry-After)
    ├── NoHealthyWorker               503 service_unavailable
    ├── LimiterUnavailable            503 service_unavailable (limits fail closed)
    └── UpstreamError                 the worker failed us
        ├── UpstreamRejected          the worker's own 4xx, passed through with its message
        ├── UpstreamUnavailable       502 (5xx, bad answer) or 503 (connection refused)
        │   └── UpstreamProtocolError 502: a 200 the gateway cannot read (not JSON, or
        │                             JSON of the wrong shape); retried like a 5xx
        ├── UpstreamTooLarge          502: an answer past server.max_response_bytes; the
        │                             request asked for it, so it is neither retried nor
        │                             held against the worker
        └── UpstreamTimeout           504

Adapters map aiohttp's exceptions into this tree at the transport boundary
(`raise UpstreamTimeout(...) from exc`); `error_response` is the only place that turns
an exception into status + OpenAI-shaped body ``{"error": {message, type, param, code}}``.
Anything else that escapes a handler is a bug: `internal_error` wraps it as a bare
`GatewayError` (500 `internal_error`) carrying a request id, the one key under which the
traceback was logged.
"""

from __future__ import annotations

import logging
import math
import traceback
import uuid

import orjson
from starlette.responses import Response

log = logging.getLogger("specroute.gateway")


class GatewayError(Exception):
    status = 500
    type = "api_error"
    retry_after_s: float | None = None  # sent as Retry-After (whole seconds, rounded up)

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None, request_id: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.request_id = request_id
        if status is not None:
            self.status = status

    def body(self) -> dict:
        error = {"message": self.message, "type": self.type, "param": self.param,
                 "code": self.code}
        if self.request_id is not None:
            error["request_id"] = self.request_id
        return {"error": error}


class ClientError(GatewayError):
    status = 400
    type = "invalid_request_error"


class InvalidRequest(ClientError):
    pass


class AuthenticationFailed(ClientError):
    status = 401
    type = "authentication_error"


class PermissionDenied(ClientError):
    status = 403
    type = "permission_error"


class ModelNotFound(ClientError):
    status = 404
    type = "not_found_error"


class PayloadTooLarge(ClientError):
    status = 413


class MisdirectedRequest(ClientError):
    status = 421


class RequestTimeout(ClientError):
    status = 408


class UnsupportedMediaType(ClientError):
    status = 415


class RateLimited(ClientError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float, code: str) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class NoHealthyWorker(GatewayError):
    status = 503
    type = "service_unavailable"


class LimiterUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, code="rate_limiter_unavailable")
        self.retry_after_s = retry_after_s


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"


class UpstreamRejected(UpstreamError):
    """The worker refused the request with a 4xx; the client gets that status."""

    type = "invalid_request_error"


class UpstreamUnavailable(UpstreamError):
    pass


class UpstreamTooLarge(UpstreamError):
    pass


class UpstreamProtocolError(UpstreamUnavailable):
    """The worker answered 200 with something that is not the engine's protocol: bytes
    that are not JSON, or JSON of the wrong shape (a string for a counter, a list for
    an object, no choices). Read at the adapter boundary
    (`gateway.upstream.adapters.reply`); it counts against the worker's breaker and is
    retried on another worker before the first token, as a 5xx is."""

    def __init__(self, worker: str, what: str) -> None:
        super().__init__(f"worker {worker} sent a malformed reply: {what}",
                         code="upstream_protocol_error")


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout_error"


def traceback_text(exc: BaseException) -> str:
    """The exception's type and frames without its message, for the log: a message may
    quote the request (its prompt, its key)."""
    name = type(exc).__qualname__
    return (f"{name}\nTraceback (most recent call last):\n"
            f"{''.join(traceback.format_tb(exc.__traceback__))}{name}")


def internal_error(exc: BaseException, where: str) -> GatewayError:
    """A bug, logged with its traceback under a fresh request id; what the client gets
    is the id alone. Logged are the frames and the exception's type, never its message,
    which may quote the request (its prompt, its key)."""
    request_id = uuid.uuid4().hex
    log.error("internal error, request id %s, %s: %s", request_id, where,
              traceback_text(exc))
    return GatewayError(f"The gateway failed to process the request (request id "
                        f"{request_id}); the operator's log has the details",
                        code="internal_error", request_id=request_id)


def error_body(exc: GatewayError) -> bytes:
    return orjson.dumps(exc.body())


def retry_after(exc: GatewayError) -> str | None:
    """The Retry-After value (RFC 9110 10.2.3: whole seconds), if the error has one."""
    if exc.retry_after_s is None:
        return None
    return str(max(1, math.ceil(exc.retry_after_s)))


def error_response(exc: GatewayError, headers: dict[str, str] | None = None) -> Response:
    """The single conversion from the exception tree to an HTTP response."""
    if exc.request_id is not None:
        headers = {**(headers or {}), "x-request-id": exc.request_id}
    if (after := retry_after(exc)) is not None:
        headers = {**(headers or {}), "retry-after": after}
    return Response(error_body(exc), status_code=exc.status, headers=headers,
                    media_type="application/json")


def shutting_down() -> GatewayError:
    """What a request still running when the shutdown drain ends is told
    (`server.drain_timeout_s`): a 503 before its answer started, an error event after."""
    error = GatewayError("The gateway is shutting down; retry on another replica",
                         status=503, code="shutting_down")
    error.type = "service_unavailable"
    return error


def body_too_large(limit: int) -> PayloadTooLarge:
    """A request body over `server.max_body_bytes`, however it arrived."""
    return PayloadTooLarge(f"Request body is larger than {limit} bytes",
                           code="request_too_large")


def invalid_json(exc: Exception) -> InvalidRequest:
    return InvalidRequest(f"The request body is not valid JSON: {exc}", code="invalid_json")
