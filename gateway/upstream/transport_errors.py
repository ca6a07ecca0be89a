"""What a call to a worker can fail with below HTTP semantics (no status to judge it by),
raised by the upstream client (`gateway.upstream.http1`) and mapped to the gateway's error
tree at the adapters' boundary (`gateway.upstream.adapters.calls.transport_error`)."""

from __future__ import annotations


class HttpError(Exception):
    """A worker call failed below HTTP semantics (no status to judge it by)."""


class ConnectTimeout(HttpError):
    pass


class ConnectFailed(HttpError):
    pass


class ReadTimeout(HttpError):
    pass


class Disconnected(HttpError):
    pass


class BadResponse(HttpError):
    pass


class TooLarge(HttpError):
    pass
