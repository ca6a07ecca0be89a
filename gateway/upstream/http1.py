"""HTTP/1.1 to the workers on the request path: keep-alive connections, httptools parsing.

Why not aiohttp here: on loopback its client spends several times this one's CPU on a
request (a POST to `bench.gateway.upstream` and reading the answer), and the gateway
makes one such call per generated request (figures: docs/PERFORMANCE.md). aiohttp stays
for the gateway's other calls to workers (prior probes, `/metrics` scrapes,
`/server_info`), where speed does not matter.

What it does: one request per connection at a time, the body known in advance;
answers with `Content-Length`, chunked, or ended by the close, read whole, by line or
as they arrive; connections kept per
worker and reused once an answer was read to its end with keep-alive; `https://`
workers through the default TLS context. Three deadlines, as the session it replaces
had: connect (a new connection), read (the longest silence between two arrivals of
data) and total (the whole exchange, answer included). Two guards for uvloop: a read
deadline that comes due while the worker's bytes wait unread in the socket is not a
silence (uvloop runs due timers before it polls sockets: a loop held up past the
deadline would blame the worker), so it starts again; and a timer that fires before its
time (uvloop keeps timers in whole milliseconds) is set again for the rest, else a total
deadline read as a silence just before the caller's own. Not done: redirects, cookies,
compression (the gateway asks for none), proxies, pipelining, `Expect: 100-continue`.

Errors, all `HttpError`:

    HttpError
    ├── ConnectTimeout      no connection within the connect deadline
    ├── ConnectFailed       refused, unreachable, TLS handshake failed
    ├── ReadTimeout         silence past the read deadline, or the total deadline passed
    ├── Disconnected        the worker closed the connection before the answer's end
    ├── BadResponse         not HTTP/1.x, or a line past the reader's limit
    └── TooLarge            a body read whole past `server.max_response_bytes`

`gateway.upstream.adapters.calls` maps them to the gateway's error tree.
"""

from __future__ import annotations

import asyncio
import select
import ssl
import time
from collections import deque

import httptools

from gateway.config import DEFAULT_SERVER
from gateway.upstream.targets import Target, target
from gateway.upstream.transport_errors import (
    BadResponse,
    ConnectFailed,
    ConnectTimeout,
    Disconnected,
    HttpError,
    ReadTimeout,
    TooLarge,
)

IDLE_PER_WORKER = 256  # idle keep-alive connections kept per worker; more are closed
IDLE_EXPIRY_S = 30.0  # an idle connection older than this is closed, not reused
# A kept connection idle at least this long may have been closed by the worker's own
# keep-alive timeout (uvicorn's: 5 s) as the request went out: such a close, before any
# answer, is retried once on a new connection. One idle for less was not timed out: its
# close is the worker's doing, and the request, perhaps read, is not sent again.
STALE_AFTER_S = 1.0
HIGH_WATER = 1 << 20  # unread answer bytes at which the connection stops reading


class Response:
    """An answer being read: its status once the head arrived, then its body, whole
    (`read`) or line by line (`readline`). `close()` ends it: the connection goes back
    to the pool when the answer was read to its end and may be kept, else it closes."""

    __slots__ = ("status", "connection", "buffer", "complete", "error", "waiter",
                 "deadline", "read_s", "head", "timer", "until", "max_body")

    def __init__(self, connection: Connection, deadline: float, read_s: float,
                 max_body: int = DEFAULT_SERVER.max_response_bytes) -> None:
        self.status = 0
        self.connection = connection
        self.buffer = bytearray()
        self.complete = False  # the whole answer has arrived
        self.head = False  # its status line and headers have
        self.error: HttpError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.deadline = deadline  # time.monotonic() of the total deadline
        self.read_s = read_s
        self.timer: asyncio.TimerHandle | None = None
        self.until = 0.0  # time.monotonic() at which the armed deadline passes
        self.max_body = max_body  # what `read` holds at most

    # -- fed by the connection ----------------------------------------------------------
    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, error: HttpError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        self.wake()

    # -- read by the caller -------------------------------------------------------------
    async def wait(self) -> None:
        """Until something arrives, within the read and total deadlines."""
        failed = self.error  # a local: a narrowed `self.error` would stay None past the
        if failed is not None:  # await for mypyc, which then rejects the error set meanwhile
            raise failed
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if now >= self.deadline:
            raise ReadTimeout("the total deadline passed")
        waiter = self.waiter = loop.create_future()
        self._arm(loop, waiter, now)
        self.connection.resume()
        try:
            await waiter
        finally:
            self.timer.cancel()  # type: ignore[union-attr]
            self.waiter = None
        if self.error is not None:
            raise self.error

    def _arm(self, loop: asyncio.AbstractEventLoop, waiter: asyncio.Future[None],
             now: float) -> None:
        self.until = min(self.deadline, now + self.read_s)
        self.timer = loop.call_later(self.until - now, self._expire, waiter)

    def _expire(self, waiter: asyncio.Future[None]) -> None:
        if waiter.done():
            return
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        if now < self.until:  # uvloop keeps timers in whole milliseconds: some fire early
            self.timer = loop.call_later(max(self.until - now, 0.001), self._expire, waiter)
            return
        total = now >= self.deadline
        if not total and self.connection.unread():
            self._arm(loop, waiter, now)  # the loop ran late
            return
        waiter.set_exception(ReadTimeout("the total deadline passed" if total
                                         else f"no data for {self.read_s:g} s"))

    async def started(self) -> None:
        while not self.head:
            await self.wait()

    async def read(self) -> bytes:
        """The whole body; `TooLarge` past `max_body` bytes, checked as they arrive, so a
        worker's runaway answer is never held whole (`close()` then drops the connection,
        and the worker sees its client leave)."""
        while not self.complete:
            self._check_size()
            await self.wait()
        self._check_size()
        body = bytes(self.buffer)
        self.buffer.clear()
        return body

    def _check_size(self) -> None:
        if len(self.buffer) > self.max_body:
            raise TooLarge(f"the answer is larger than {self.max_body} bytes "
                           f"(server.max_response_bytes)")

    async def read_some(self) -> bytes:
        """What has arrived of the body, waiting for something; b"" at its end."""
        while not self.buffer and not self.complete:
            await self.wait()
        chunk = bytes(self.buffer)
        self.buffer.clear()
        return chunk

    async def readline(self, limit: int) -> bytes:
        """The next line with its `\\n`; at the end what is left (b"" when nothing)."""
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[:end + 1])
                del self.buffer[:end + 1]
                return line
            if len(self.buffer) > limit:
                raise BadResponse(f"a line longer than {limit} bytes")
            if self.complete:
                line = bytes(self.buffer)
                self.buffer.clear()
                return line
            await self.wait()

    def close(self) -> None:
        self.connection.finish(self)


class Connection(asyncio.Protocol):
    """One keep-alive connection to a worker; one answer at a time."""

    __slots__ = ("client", "key", "transport", "parser", "response", "closed", "paused",
                 "idled_s", "idle_since", "sized", "keep", "stray")

    def __init__(self, client: Http1Client, key: Target) -> None:
        self.client, self.key = client, key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: Response | None = None
        self.closed = self.paused = False
        self.idled_s = 0.0  # how long it had been idle when taken for this request
        self.idle_since = 0.0
        self.sized = False  # the answer has a length or is chunked (else: ends at close)
        self.keep = False  # the answer, complete, left the connection usable
        self.stray = False  # the worker sent more than one answer to the request

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        response = self.response
        if response is None:  # nothing asked: a worker talking out of turn
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response.fail(BadResponse(f"not an HTTP/1.1 answer: {exc}"))
            self.abort()
            return
        if len(response.buffer) > HIGH_WATER and not response.complete and not self.paused:
            self.paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        response.wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        response = self.response
        if response is None or response.complete:
            return
        if response.head and not self.sized and exc is None:
            response.complete = True  # a body without a length ends at the close
            response.wake()
        else:
            response.fail(Disconnected("the worker closed the connection"
                                       + (f": {exc}" if exc else "")))

    # -- httptools callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.response is not None and self.response.complete:
            # a second answer to one request (a worker out of step): ignored, and the
            # connection, whose answers no longer match its requests, is not kept
            self.stray = True

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-length" or (lowered == b"transfer-encoding"
                                            and b"chunked" in value.lower()):
            self.sized = True

    def on_headers_complete(self) -> None:
        response = self.response
        assert response is not None
        if self.stray:
            return
        response.status = self.parser.get_status_code()
        response.head = True

    def on_body(self, body: bytes) -> None:
        if not self.stray:
            self.response.buffer += body  # type: ignore[union-attr]

    def on_message_complete(self) -> None:
        response = self.response
        assert response is not None
        if self.stray:
            return
        response.complete = True
        self.sized = True  # complete by its framing, whatever the headers said
        self.keep = self.parser.should_keep_alive()  # read now: the parser resets after

    # -- used by the client ------------------------------------------------------------
    def begin(self, response: Response, request: bytes) -> None:
        self.response, self.sized, self.keep, self.stray = response, False, False, False
        self.transport.write(request)  # type: ignore[union-attr]

    def unread(self) -> bool:
        """Whether bytes (or the worker's close) wait in the socket, not yet read."""
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is None or self.closed:
            return False
        try:
            return bool(select.select([sock.fileno()], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def resume(self) -> None:
        if self.paused:
            self.paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def finish(self, response: Response) -> None:
        """The caller is done with `response`: keep the connection if it may be."""
        if self.response is not response:
            return
        self.response = None
        if response.complete and not self.closed and self.keep and not self.stray:
            self.client.park(self)
        else:
            self.abort()

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Http1Client:
    """Requests to workers over kept connections. Build it in the app's lifespan and
    `close()` it at shutdown; the deadlines are the server's (`server.connect_timeout_s`,
    `read_timeout_s`, `total_timeout_s`), and so is the most a body read whole may hold
    (`max_response_bytes`)."""

    def __init__(self, connect_s: float, read_s: float, total_s: float,
                 max_response_bytes: int = DEFAULT_SERVER.max_response_bytes) -> None:
        self.connect_s, self.read_s, self.total_s = connect_s, read_s, total_s
        self.max_response_bytes = max_response_bytes
        self.idle: dict[Target, deque[Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def request(self, method: str, worker: str, path: str, body: bytes = b"",
                      headers: dict[str, str] | None = None,
                      total_s: float | None = None, deadline: float | None = None
                      ) -> Response:
        """Send one request; return its `Response` once the answer's head arrived. The
        whole exchange ends by `deadline` (`time.monotonic()`), else `total_s` (else the
        client's own) from now. The
        caller must `close()` it (a `with`-less API: `calls.post_ok` does). A kept
        connection the worker closed as the request went out, after idling
        `STALE_AFTER_S` or more, is replaced once."""
        key = target(worker)
        if deadline is None:
            deadline = time.monotonic() + (self.total_s if total_s is None else total_s)
        extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()) \
            if headers else ""
        request = (f"{method} {key.prefix}{path} HTTP/1.1\r\nHost: {key.authority.decode()}"
                   f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
                   f"\r\n{extra}\r\n").encode("latin-1") + body
        for attempt in (0, 1):
            connection = await self._connection(key, deadline)
            response = Response(connection, deadline, self.read_s, self.max_response_bytes)
            connection.begin(response, request)
            try:
                await response.started()
                return response
            except Disconnected:
                connection.abort()
                if connection.idled_s < STALE_AFTER_S or response.buffer or response.head \
                        or attempt:
                    raise
            except BaseException:
                connection.abort()
                raise
        raise AssertionError("unreachable")

    async def _connection(self, key: Target, deadline: float) -> Connection:
        idle = self.idle.get(key)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_EXPIRY_S:
                connection.idled_s = now - connection.idle_since
                return connection
            connection.abort()
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if key.scheme == "https" else None
        try:
            async with asyncio.timeout(max(0.0, min(self.connect_s, deadline - now))):
                _, connection = await loop.create_connection(
                    lambda: Connection(self, key), key.host, key.port, ssl=tls,
                    server_hostname=key.host if tls else None)
        except TimeoutError as exc:
            raise ConnectTimeout(f"no connection within {self.connect_s:g} s") from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}") from exc
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def park(self, connection: Connection) -> None:
        idle = self.idle.setdefault(connection.key, deque())
        if len(idle) >= IDLE_PER_WORKER:
            connection.abort()
            return
        connection.idle_since = time.monotonic()
        idle.append(connection)

    def close(self) -> None:
        """Close every idle connection (those in use close when their caller ends)."""
        for idle in self.idle.values():
            for connection in idle:
                connection.abort()
        self.idle.clear()
