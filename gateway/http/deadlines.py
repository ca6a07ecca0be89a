"""Deadlines of the requests in flight, on one shared timer that ticks while any is armed.

`asyncio.timeout` gives each use a timer of the loop's own (a `TimerHandle` pushed on
the loop's heap, cancelled and left there until the heap is swept) and runs its context
in Python: ~4.9 µs of CPU a use, against ~0.1 µs for the awaited call inside, and ~1.1
for an entry here, compiled (CPython 3.11; docs/results/2026-12-07-hot-path.md). A request
used four (the body, the upstream call, the answer's two messages) and a stream one more
per chunk. Here a deadline is an entry in a dict, in and out, and one loop timer every
`tick_s` while any entry is armed expires those past due: a deadline fires up to
`tick_s` late, never early. The deadlines it serves are seconds long (a slow body, a
client that stopped reading: `server.body_timeout_s`, `send_timeout_s`), where a tick of
10 ms is noise.

`Clock.within(seconds)` is a context manager with `asyncio.timeout`'s contract: past the
deadline the task is cancelled, and the `CancelledError` that reaches the block's end
leaves it as `TimeoutError`; a cancellation from elsewhere (the client left, the drain
at shutdown) goes through as it came (`Task.uncancel` counts, as in
`asyncio.timeouts`). A `with`, not an `async with`: entering and leaving awaits nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

TICK_S = 0.01


class Timed(Protocol):
    def fire(self) -> None:
        """The entry's time came (called once, from the loop, after it left the clock)."""


class Clock:
    """The armed entries, each with its time (`time.monotonic()`); one timer for all.
    Build one per app (its timer belongs to the running loop of the first entry; a new
    loop, as in tests that run an app twice, gets a timer of its own)."""

    __slots__ = ("tick_s", "armed", "timer", "loop")

    def __init__(self, tick_s: float = TICK_S) -> None:
        self.tick_s = tick_s
        self.armed: dict[Timed, float] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def arm(self, entry: Timed, when: float) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:  # entries of a loop that ended can never be served
            self.armed.clear()
            self.loop, self.timer = loop, None
        self.armed[entry] = when
        if self.timer is None:
            self.timer = loop.call_later(self.tick_s, self._tick)

    def disarm(self, entry: Timed) -> None:
        self.armed.pop(entry, None)

    def within(self, seconds: float) -> Within:
        """A deadline `seconds` from now for the current task (see the module)."""
        return Within(self, time.monotonic() + seconds)

    def _tick(self) -> None:
        now = time.monotonic()
        due = [entry for entry, when in self.armed.items() if when <= now]
        for entry in due:
            del self.armed[entry]
        self.timer = self.loop.call_later(self.tick_s, self._tick) \
            if self.armed and self.loop is not None else None  # before any entry fires
        for entry in due:
            entry.fire()


class Within:
    """One deadline on the current task; `expired` once it fired."""

    __slots__ = ("clock", "when", "task", "cancelling", "expired")

    def __init__(self, clock: Clock, when: float) -> None:
        self.clock, self.when, self.expired = clock, when, False

    def __enter__(self) -> Within:
        task = asyncio.current_task()
        assert task is not None, "a deadline belongs to a task"
        self.task, self.cancelling = task, task.cancelling()
        self.clock.arm(self, self.when)
        return self

    def fire(self) -> None:
        self.expired = True
        self.task.cancel()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        if not self.expired:
            self.clock.disarm(self)
        elif self.task.uncancel() <= self.cancelling and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc
