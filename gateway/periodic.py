"""One coroutine run every `interval_s` in a background task of the gateway's loop.

Health probes, registry discovery and worker-prior probes share this lifecycle: started in
the app's lifespan, cancelled (and awaited) at shutdown. A tick that raises ends the loop,
so ticks handle their own errors.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class Periodic:
    def __init__(self, name: str, tick: Callable[[], Awaitable[None]], interval_s: float) -> None:
        self.name = name
        self.tick = tick
        self.interval_s = interval_s
        self._task: asyncio.Task | None = None

    def start(self, *, wait_first: bool = False) -> None:
        """Run `tick` now and then every `interval_s` (after one interval if `wait_first`)."""
        self._task = asyncio.create_task(self._run(wait_first), name=self.name)

    async def _run(self, wait_first: bool) -> None:
        if wait_first:
            await asyncio.sleep(self.interval_s)
        while True:
            await self.tick()
            await asyncio.sleep(self.interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
