"""Cancelling a request whose client left (the upstream request stops with it), and cutting
one that stopped reading."""

from __future__ import annotations

import asyncio
import time

from starlette.types import Message, Receive, Send

from gateway.http.deadlines import Clock

WATCH_AFTER_S = 0.05  # most requests are over by then: no waiter for them at all


class DisconnectWatch:
    """Cancels the request's own task when the client disconnects mid-request.

    One `receive()` waiter per request instead of a second task around the work (a task
    costs a creation and an extra loop turn), and only from `after_s` on: a request over
    before then never makes one (an entry on the app's deadline clock costs far less than
    a task, and than a timer of its own), and a client
    that leaves earlier is seen at `after_s` (uvicorn answers `receive()` at once with the
    disconnect it already saw). `close()` disarms it when the request is done: from then
    on a late disconnect message (uvicorn answers `receive()` with one as soon as the
    response is complete) must not cancel the server's task."""

    __slots__ = ("task", "receive", "waiter", "clock", "armed", "fired")

    def __init__(self, receive: Receive, clock: Clock, after_s: float = 0.0) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.task, self.receive = task, receive
        self.armed, self.fired = True, False
        self.waiter: asyncio.Future | None = None
        self.clock: Clock | None = None
        if after_s > 0:  # on the app's clock (`gateway.http.deadlines`): no timer of its own
            self.clock = clock
            clock.arm(self, time.monotonic() + after_s)
        else:
            self.fire()

    def fire(self) -> None:
        """From `after_s` on: wait for the client's next message."""
        self.clock = None
        if self.armed:
            self.waiter = asyncio.ensure_future(self.receive())
            self.waiter.add_done_callback(self._done)

    def _done(self, message: asyncio.Future) -> None:
        if self.armed and not message.cancelled() and message.exception() is None \
                and message.result()["type"] == "http.disconnect":
            self.fired = True
            self.task.cancel()

    def close(self) -> None:
        """Disarm; a cancellation this watch caused is taken back (`uncancel`)."""
        self.armed = False
        if self.clock is not None:
            self.clock.disarm(self)
        if self.waiter is not None:
            self.waiter.cancel()
        if self.fired:
            self.task.uncancel()


class ClientStalled(Exception):
    """The client stopped taking the response (its TCP window at zero): the request is
    cut, what it held is freed."""


class TimedSend:
    """`send` with a deadline on each message: uvicorn waits on flow control while a
    client reads nothing, and would hold the request's admission slot and its upstream
    connection for as long. Past `timeout_s` one message raises `ClientStalled`; later
    messages are dropped, so the cleanup in `finally` blocks runs to its end."""

    __slots__ = ("send", "timeout_s", "clock", "stalled")

    def __init__(self, send: Send, timeout_s: float, clock: Clock) -> None:
        self.send, self.timeout_s, self.clock, self.stalled = send, timeout_s, clock, False

    async def __call__(self, message: Message) -> None:
        if self.stalled:
            return
        try:
            with self.clock.within(self.timeout_s):
                await self.send(message)
        except TimeoutError as exc:
            self.stalled = True
            raise ClientStalled(f"the client took no data for {self.timeout_s:g} s "
                                f"(server.send_timeout_s)") from exc
