"""The gateway's one exception tree, and its one conversion to an HTTP response.

::

    GatewayError                      (500 api_error; only for bugs)
    ├── ClientError                   4xx: the request is at fault
    │   ├── InvalidRequest            400 invalid_request_error (names `param`)
    │   ├── AuthenticationFailed      401 authentication_error
    │   ├── ModelNotFound             404 not_found_error
    │   ├── PayloadTooLarge           413 invalid_request_error
    │   └── RateLimited               429 rate_limit_error
    ├── NoHealthyWorker               503 service_unavailable
    └── UpstreamError                 the worker failed us
        ├── UpstreamRejected          the worker's own 4xx, passed through with its message
        ├── UpstreamUnavailable       502 (5xx, bad answer) or 503 (connection refused)
        └── UpstreamTimeout           504

Adapters map aiohttp's exceptions into this tree at the transport boundary
(`raise UpstreamTimeout(...) from exc`); `error_response` is the only place that turns
an exception into status + OpenAI-shaped body ``{"error": {message, type, param, code}}``.
"""

from __future__ import annotations

import orjson
from starlette.responses import Response


class GatewayError(Exception):
    status = 500
    type = "api_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        if status is not None:
            self.status = status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


class ClientError(GatewayError):
    status = 400
    type = "invalid_request_error"


class InvalidRequest(ClientError):
    pass


class AuthenticationFailed(ClientError):
    status = 401
    type = "authentication_error"


class ModelNotFound(ClientError):
    status = 404
    type = "not_found_error"


class PayloadTooLarge(ClientError):
    status = 413


class RateLimited(ClientError):
    status = 429
    type = "rate_limit_error"


class NoHealthyWorker(GatewayError):
    status = 503
    type = "service_unavailable"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"


class UpstreamRejected(UpstreamError):
    """The worker refused the request with a 4xx; the client gets that status."""

    type = "invalid_request_error"


class UpstreamUnavailable(UpstreamError):
    pass


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "timeout_error"


def error_body(exc: GatewayError) -> bytes:
    return orjson.dumps(exc.body())


def error_response(exc: GatewayError, headers: dict[str, str] | None = None) -> Response:
    """The single conversion from the exception tree to an HTTP response."""
    return Response(error_body(exc), status_code=exc.status, headers=headers,
                    media_type="application/json")
