"""Faults in OpenAI shape: the exception handlers and the answer to a bug.

A `GatewayError` becomes its OpenAI-shaped answer; Starlette's own 404/405 too; anything
else is a bug, answered with a 500 `internal_error` carrying a request id, in the shape
the client can still receive (`SentWatch`: before the head, mid-stream, after the end).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Scope, Send

from gateway.errors import GatewayError, error_body, error_response, internal_error


async def gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 in OpenAI shape."""
    assert isinstance(exc, HTTPException)
    error = GatewayError(str(exc.detail), status=exc.status_code,
                         code="not_found" if exc.status_code == 404 else "method_not_allowed")
    error.type = "invalid_request_error"
    return error_response(error)


def log_fault(scope: Scope, exc: BaseException) -> GatewayError:
    """`errors.internal_error` for this request, marked on the scope as answered."""
    error = internal_error(exc, f"{scope.get('method')} {scope.get('path')}")
    scope["specroute.request_id"] = error.request_id
    return error


async def internal_fault(request: Request, exc: Exception) -> Response:
    """Starlette's `ServerErrorMiddleware` hands unhandled exceptions here (then
    re-raises; `GatewayApp` takes it from there without logging it twice)."""
    return error_response(log_fault(request.scope, exc))


class SentWatch:
    """Wraps `send`, remembering how far the response got, so a fault is answered in
    the shape the client can still receive."""

    __slots__ = ("send", "start", "done")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.start: Message | None = None
        self.done = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
        elif not message.get("more_body", False):
            self.done = True
        await self.send(message)

    @property
    def streaming(self) -> bool:
        return self.start is not None and any(
            name == b"content-type" and value.startswith(b"text/event-stream")
            for name, value in self.start["headers"])

    async def fault(self, error: GatewayError) -> None:
        """Before the head: a 500 with `x-request-id`. Mid-stream: an SSE error event and
        the end of the body. After the end: nothing left to say."""
        if self.start is None:
            body = error_body(error)
            await self({"type": "http.response.start", "status": error.status,
                             "headers": [(b"content-type", b"application/json"),
                                         (b"content-length", str(len(body)).encode()),
                                         (b"x-request-id", str(error.request_id).encode())]})
            await self({"type": "http.response.body", "body": body})
        elif not self.done:
            event = b"data: " + error_body(error) + b"\n\ndata: [DONE]\n\n"
            await self({"type": "http.response.body",
                             "body": event if self.streaming else b""})
