"""A request body as HTTP brings it: its declared length, its media type, and reading it
whole within a size cap and a deadline. Shared by the token routes and the picker."""

from __future__ import annotations

from starlette.types import Receive

from gateway.errors import InvalidRequest, RequestTimeout, UnsupportedMediaType, body_too_large
from gateway.http.deadlines import Clock


def content_length(value: bytes | None) -> int | None:
    """The declared length; None when absent or not plain digits (the server's parser
    has the last word on those). Past 18 digits `int` would be slow or refuse (Python's
    4300-digit limit), and any such length is over every body limit anyway."""
    if value is None or not value.isdigit():
        return None
    return int(value) if len(value) <= 18 else 10**18


def check_media_type(value: bytes | None) -> None:
    """`application/json` (parameters such as a charset allowed, `+json` types too), on
    every POST; anything else, or none, is a 415. A browser sends a cross-site POST
    without asking first (no CORS preflight) only when its type is a form type,
    `text/plain`, or absent (a Blob with no type): requiring JSON keeps a web page's
    script from driving a gateway it can reach (a local one, issue 43)."""
    if value is None:
        raise UnsupportedMediaType("Content-Type must be application/json, got none",
                                   param="content-type", code="unsupported_media_type")
    media = value.split(b";", 1)[0].strip().lower()
    if media != b"application/json" and not media.endswith(b"+json"):
        raise UnsupportedMediaType(
            f"Content-Type must be application/json, got {value.decode('latin-1')[:100]!r}",
            param="content-type", code="unsupported_media_type")


async def read_body(receive: Receive, limit: int, content_length: int | None,
                    timeout_s: float, clock: Clock) -> bytes:
    """The whole body, at most `limit` bytes, within `timeout_s` of the headers (on
    `clock`): a client trickling its body (slow loris) gets a 408 instead of holding the
    connection."""
    if content_length is not None and content_length > limit:
        raise body_too_large(limit)
    chunks, size = [], 0
    try:
        with clock.within(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise InvalidRequest("client disconnected", code="client_disconnected")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise body_too_large(limit)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError as exc:
        raise RequestTimeout(f"The request body did not arrive within {timeout_s:g} s",
                             code="request_timeout") from exc
