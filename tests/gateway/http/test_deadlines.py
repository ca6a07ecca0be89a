"""The deadline clock keeps `asyncio.timeout`'s contract: a block past its deadline ends
in `TimeoutError` (never before it, at most a tick after), a block done in time is left
alone, and a cancellation from elsewhere goes through as a cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.http.deadlines import Clock


async def test_a_block_past_its_deadline_times_out_not_before_it() -> None:
    clock = Clock(tick_s=0.01)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        with clock.within(0.05):
            await asyncio.sleep(5)
    took = time.monotonic() - start
    assert 0.05 <= took < 1
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    assert not clock.armed


async def test_a_block_done_in_time_is_left_alone_and_the_timer_stops() -> None:
    clock = Clock(tick_s=0.01)
    for _ in range(3):
        with clock.within(0.05):
            await asyncio.sleep(0)
    assert not clock.armed
    await asyncio.sleep(0.1)  # past the deadlines: nothing fires, the timer stopped
    assert clock.timer is None
    await asyncio.sleep(0)  # this task was not cancelled


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    clock = Clock(tick_s=0.01)
    entered = asyncio.Event()

    async def work() -> str:
        with clock.within(30):
            entered.set()
            await asyncio.sleep(30)
        return "finished"

    task = asyncio.ensure_future(work())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not clock.armed


async def test_many_deadlines_share_one_timer_and_each_fires_for_its_own_task() -> None:
    clock = Clock(tick_s=0.01)

    async def wait(deadline_s: float, work_s: float) -> str:
        try:
            with clock.within(deadline_s):
                await asyncio.sleep(work_s)
        except TimeoutError:
            return "timed out"
        return "finished"

    results = await asyncio.gather(*(wait(0.05, 5) for _ in range(5)),
                                   *(wait(5, 0.02) for _ in range(5)))
    assert results == ["timed out"] * 5 + ["finished"] * 5
    assert not clock.armed
