"""The gateway's HTTP/1.1 client against real sockets: a scripted worker per test
(`asyncio.start_server` on 127.0.0.1) answering byte for byte what the case needs."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from gateway.upstream.http1 import STALE_AFTER_S, Http1Client, target
from gateway.upstream.transport_errors import (
    BadResponse,
    ConnectFailed,
    Disconnected,
    ReadTimeout,
    TooLarge,
)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request: its head and its Content-Length body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head + await reader.readexactly(length)


class Worker:
    """A scripted worker; counts connections and keeps the requests it read."""

    def __init__(self, handler: Handler) -> None:
        self.handler, self.connections, self.requests = handler, 0, []
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def worker() -> AsyncIterator[Callable[[Handler], Awaitable[Worker]]]:
    started: list[Worker] = []

    async def start(handler: Handler) -> Worker:
        scripted = Worker(handler)
        scripted.server = await asyncio.start_server(scripted.serve, "127.0.0.1", 0)
        started.append(scripted)
        return scripted

    yield start
    for scripted in started:
        assert scripted.server is not None
        scripted.server.close()


@pytest.fixture
async def client() -> AsyncIterator[Http1Client]:
    upstream = Http1Client(connect_s=2, read_s=2, total_s=5)
    yield upstream
    upstream.close()


def keep_alive(answer: bytes, requests: list[bytes] | None = None) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await read_request(reader)
            if requests is not None:
                requests.append(request)
            writer.write(answer)
            await writer.drain()

    return handler


async def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.01)


def answer_once(answer: bytes, linger_s: float = 0.0) -> Handler:
    """Read one request, write `answer`, wait `linger_s`, close."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(linger_s)

    return handler


async def test_a_connection_is_kept_and_reused(worker, client: Http1Client) -> None:
    requests: list[bytes] = []
    scripted = await worker(keep_alive(OK, requests))
    for _ in range(3):
        resp = await client.request("POST", scripted.url, "/generate", b'{"a": 1}',
                                    {"traceparent": "00-x"})
        assert resp.status == 200 and await resp.read() == b"hello"
        resp.close()
    assert scripted.connections == 1
    assert requests[0].startswith(b"POST /generate HTTP/1.1\r\n")
    assert b"\r\ntraceparent: 00-x\r\n" in requests[0] and requests[0].endswith(b'{"a": 1}')


async def test_chunked_answers_read_whole_and_by_line(worker, client: Http1Client) -> None:
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"4\r\nab\nc\r\n3\r\nd\ne\r\n0\r\n\r\n")
    scripted = await worker(keep_alive(answer))
    resp = await client.request("POST", scripted.url, "/x")
    assert await resp.read() == b"ab\ncd\ne"
    resp.close()
    resp = await client.request("POST", scripted.url, "/x")
    lines = [await resp.readline(100) for _ in range(4)]
    assert lines == [b"ab\n", b"cd\n", b"e", b""]
    resp.close()
    resp = await client.request("POST", scripted.url, "/x")
    chunks = []
    while chunk := await resp.read_some():
        chunks.append(chunk)
    assert b"".join(chunks) == b"ab\ncd\ne"
    resp.close()
    assert scripted.connections == 1


async def test_a_body_without_length_ends_at_the_close(worker, client: Http1Client) -> None:
    scripted = await worker(answer_once(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
                                        b"until the end"))
    resp = await client.request("POST", scripted.url, "/x")
    assert await resp.read() == b"until the end"
    resp.close()
    assert not client.idle.get(target(scripted.url))  # not kept: the worker closed it


async def test_a_cut_body_is_a_disconnect(worker, client: Http1Client) -> None:
    scripted = await worker(answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"
                                        b"only this"))
    resp = await client.request("POST", scripted.url, "/x")
    with pytest.raises(Disconnected):
        await resp.read()
    resp.close()


async def test_garbage_is_a_bad_response(worker, client: Http1Client) -> None:
    scripted = await worker(answer_once(b"SSH-2.0-OpenSSH_9.6\r\n\r\n", linger_s=1))
    with pytest.raises(BadResponse):
        await client.request("POST", scripted.url, "/x")


async def test_a_line_past_the_limit_is_refused(worker, client: Http1Client) -> None:
    scripted = await worker(keep_alive(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n"
                                       + b"x" * 50))
    resp = await client.request("POST", scripted.url, "/x")
    with pytest.raises(BadResponse):
        await resp.readline(10)
    resp.close()


async def test_silence_past_the_read_deadline(worker) -> None:
    scripted = await worker(answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                                        linger_s=5))
    client = Http1Client(connect_s=2, read_s=0.2, total_s=30)
    resp = await client.request("POST", scripted.url, "/x")
    start = time.monotonic()
    with pytest.raises(ReadTimeout, match="no data for 0.2 s"):
        await resp.read()
    assert time.monotonic() - start < 2
    resp.close()
    client.close()


async def test_a_deadline_timer_that_fires_early_is_set_again(worker) -> None:
    """uvloop rounds timers to whole milliseconds, so one may fire a little before its
    time: that is neither a silence nor the total deadline (the trickle test's stream
    ended with "no data" just before the gateway's own total deadline)."""
    scripted = await worker(answer_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc",
                                        linger_s=5))
    client = Http1Client(connect_s=2, read_s=0.4, total_s=30)
    resp = await client.request("POST", scripted.url, "/x")
    start = time.monotonic()
    reading = asyncio.ensure_future(resp.read())
    await asyncio.sleep(0.1)
    assert resp.waiter is not None
    resp._expire(resp.waiter)  # the timer's callback, 0.3 s before its time
    await asyncio.sleep(0.1)
    assert not reading.done()
    with pytest.raises(ReadTimeout, match="no data for 0.4 s"):
        await reading
    assert 0.39 < time.monotonic() - start < 2
    resp.close()
    client.close()


async def test_a_trickle_still_ends_at_the_total_deadline(worker) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(100):  # a byte every 50 ms: never silent for the read deadline
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)

    scripted = await worker(handler)
    client = Http1Client(connect_s=2, read_s=1, total_s=0.5)
    start = time.monotonic()
    resp = await client.request("POST", scripted.url, "/x")
    with pytest.raises(ReadTimeout, match="total deadline"):
        await resp.read()
    assert time.monotonic() - start < 1.5
    resp.close()
    client.close()


async def test_a_refused_connection(client: Http1Client) -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    with pytest.raises(ConnectFailed):
        await client.request("POST", f"http://127.0.0.1:{port}", "/x")


async def test_a_kept_connection_the_worker_closed_is_not_reused(worker,
                                                                 client: Http1Client) -> None:
    """The worker answers one request per connection and then closes it without saying
    so (no `Connection: close`): once the close has arrived, the next request goes out
    on a new connection."""
    scripted = await worker(answer_once(OK))
    for _ in range(3):
        resp = await client.request("POST", scripted.url, "/x")
        assert await resp.read() == b"hello"
        resp.close()
        connection = resp.connection
        await wait_until(lambda: connection.closed)  # noqa: B023 - this iteration's
    assert scripted.connections == 3


async def test_a_close_racing_the_request_is_retried_once(worker,
                                                         client: Http1Client) -> None:
    """The worker closes a kept connection, idle for a while, just as the next request is
    written on it (it never reads it): that request goes out again on a new connection.
    Idle for a moment only, the close is the worker's answer: not sent again."""
    close_now = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if scripted.connections == 1:
            await close_now.wait()
            return  # closed, the second request unread
        await keep_alive(OK)(reader, writer)

    scripted = await worker(handler)
    resp = await client.request("POST", scripted.url, "/x")
    assert await resp.read() == b"hello"
    resp.close()
    client.idle[target(scripted.url)][0].idle_since -= STALE_AFTER_S  # idle long enough
    close_now.set()  # the handler closes only once the next request is on its way
    resp = await client.request("POST", scripted.url, "/x")
    assert await resp.read() == b"hello"
    resp.close()
    assert scripted.connections == 2


async def test_a_close_right_after_an_answer_is_not_retried(worker,
                                                            client: Http1Client) -> None:
    """A kept connection idle for a moment only: a close before the answer is the
    worker's (it may have read the request), so the request is not sent again."""
    close_now = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        await close_now.wait()

    scripted = await worker(handler)
    resp = await client.request("POST", scripted.url, "/x")
    assert await resp.read() == b"hello"
    resp.close()
    close_now.set()
    with pytest.raises(Disconnected):
        await client.request("POST", scripted.url, "/x")
    assert scripted.connections == 1


async def test_a_second_answer_to_one_request_is_dropped_with_the_connection(
        worker, client: Http1Client) -> None:
    scripted = await worker(keep_alive(OK + b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\n"
                                            b"oops"))
    for _ in range(2):
        resp = await client.request("POST", scripted.url, "/x")
        assert resp.status == 200 and await resp.read() == b"hello"
        resp.close()
        assert not client.idle.get(target(scripted.url))  # not kept: out of step
    assert scripted.connections == 2


async def test_leaving_early_drops_the_connection(worker, client: Http1Client) -> None:
    scripted = await worker(keep_alive(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhe"))
    resp = await client.request("POST", scripted.url, "/x")
    resp.close()  # before the body's end: the connection cannot carry another answer
    assert not client.idle.get(target(scripted.url))


async def test_a_large_answer_is_read_with_backpressure(worker, client: Http1Client) -> None:
    body = bytes(range(256)) * (3 * 4096)  # 3 MiB, past the high-water mark
    scripted = await worker(keep_alive(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                                       % len(body) + body))
    resp = await client.request("POST", scripted.url, "/x")
    assert await resp.read() == body
    resp.close()


async def test_a_runaway_answer_is_cut_at_the_size_limit(worker) -> None:
    """A body read whole stops at `max_response_bytes` while it still arrives: the
    gateway never holds the rest, and the worker sees the connection closed."""
    closed = asyncio.Event()

    async def runaway(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (1 << 30))
        try:
            while True:  # 1 GiB promised, sent until the gateway hangs up
                writer.write(b"x" * 65536)
                await writer.drain()
        except ConnectionError:
            closed.set()

    scripted = await worker(runaway)
    client = Http1Client(connect_s=2, read_s=2, total_s=5, max_response_bytes=4 << 20)
    resp = await client.request("POST", scripted.url, "/generate")
    with pytest.raises(TooLarge, match="4194304 bytes"):
        await resp.read()
    assert len(resp.buffer) < 8 << 20  # the check runs as it arrives, not at the end
    resp.close()
    await asyncio.wait_for(closed.wait(), 5)
    assert not client.idle.get(target(scripted.url))
    small = await worker(keep_alive(OK))
    resp = await client.request("POST", small.url, "/generate")
    assert await resp.read() == b"hello"  # under the limit: as before
    resp.close()


def test_worker_urls_parse() -> None:
    assert target("http://10.0.0.7:30000") == target("http://10.0.0.7:30000/")
    plain = target("http://10.0.0.7:30000")
    assert (plain.host, plain.port, plain.prefix, plain.authority) == (
        "10.0.0.7", 30000, "", b"10.0.0.7:30000")
    tls = target("https://api.example.com/openai/")
    assert (tls.scheme, tls.host, tls.port, tls.prefix) == (
        "https", "api.example.com", 443, "/openai")
    six = target("http://[::1]:8080/v")
    assert (six.host, six.port, six.prefix) == ("::1", 8080, "/v")
    with pytest.raises(ValueError):
        target("ftp://x")


def late_loop_case() -> None:
    """The worker's second chunk arrives while the event loop is held up (a callback
    running in its socket phase) past the read deadline: the bytes are there, unread."""
    server = socket.create_server(("127.0.0.1", 0))
    go = threading.Event()

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                               b"1\r\na\r\n")
            go.wait(5)
            connection.sendall(b"1\r\nb\r\n0\r\n\r\n")
            time.sleep(0.5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    class Busy(asyncio.Protocol):  # holds the loop in a socket callback
        def data_received(self, data: bytes) -> None:
            go.set()
            time.sleep(0.6)

    async def case() -> None:
        loop = asyncio.get_running_loop()
        mine, theirs = socket.socketpair()
        await loop.create_connection(Busy, sock=mine)
        client = Http1Client(connect_s=2, read_s=0.3, total_s=10)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        resp = await client.request("POST", url, "/x")
        assert await resp.read_some() == b"a"
        theirs.send(b"hold the loop")
        assert await resp.read() == b"b"
        resp.close()
        client.close()
        theirs.close()

    return case()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_late_event_loop_does_not_blame_the_worker(loop: str) -> None:
    """uvloop runs due timers before it polls sockets: without the check the read
    deadline fired first (tests/e2e/test_gateway_faults.py's trickle on a loaded box)."""
    case = late_loop_case()
    if loop == "uvloop":
        uvloop.run(case)
    else:
        asyncio.run(case)
