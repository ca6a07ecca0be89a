"""HTTP to the workers for streamed answers: the response read as SSE events.

The calls and the error mapping are `gateway.upstream.adapters.calls` (compiled); what
is here is what mypyc cannot compile, async generators: the `post` block a stream is
read in, and its events (`sse_data`). Nothing above this module sees a transport
exception.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import orjson

from gateway.errors import UpstreamProtocolError, UpstreamUnavailable
from gateway.upstream.adapters.calls import post_ok, transport_error, upstream_message
from gateway.upstream.http1 import Http1Client, Response
from gateway.upstream.transport_errors import HttpError

MAX_SSE_LINE = 64 * 1024 * 1024  # SGLang's cumulative stream text can make long lines


@asynccontextmanager
async def post(client: Http1Client, worker: str, path: str, payload: dict,
               api_key: str | None = None, deadline: float | None = None
               ) -> AsyncIterator[Response]:
    """`calls.post_ok`'s response, to read as a stream within the block; leaving the
    block before the answer's end drops the connection: the worker sees the client
    leave."""
    resp = await post_ok(client, worker, path, payload, api_key, deadline)
    try:
        try:
            yield resp
        except HttpError as exc:
            raise transport_error(worker, exc) from exc
    finally:
        resp.close()


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
