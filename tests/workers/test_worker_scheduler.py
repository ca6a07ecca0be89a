"""The worker's engine thread: every active request stepped each turn, bounded queue,
cancellation, errors kept to their request.

Driven with a counting engine (no torch) so the scheduling order is what is tested; the
real engine's batched steps are in test_engine_batch.py, behind real HTTP in
test_worker_server.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from workers.embedded.api import DecodeRequest, GenerationStats, SamplingParams
from workers.embedded.errors import Overloaded
from workers.embedded.scheduler import ErrorEvent, Scheduler, StepEvent


@dataclass
class Out:
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None = None
    matched_stop: int | None = None


FAILING = 13  # the request with this tag fails at its second step


class CountingGeneration:
    """Emits one token per step; `gate` lets a test hold the engine thread."""

    def __init__(self, length: int, gate: threading.Event, log: list[int], tag: int) -> None:
        self.stats = GenerationStats()
        self.length, self.gate, self.log, self.tag = length, gate, log, tag
        self.finished = self.cancelled = False

    def step(self) -> Out:
        self.gate.wait(5)
        if self.tag == FAILING and self.stats.completion_tokens == 1:
            raise RuntimeError("drafter broke")
        self.log.append(self.tag)
        self.stats.completion_tokens += 1
        self.stats.verify_steps += 1
        self.finished = self.stats.completion_tokens >= self.length
        return Out([self.tag], "x", self.finished, "length" if self.finished else None)

    def cancel(self) -> None:
        self.cancelled = True


class CountingEngine:
    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.log: list[int] = []
        self.generations: list[CountingGeneration] = []
        self.batches: list[int] = []  # generations per step() call

    def step(self, generations: list[CountingGeneration]) -> list[Out | Exception]:
        self.batches.append(len(generations))
        results: list[Out | Exception] = []
        for gen in generations:
            try:
                results.append(gen.step())
            except Exception as exc:
                results.append(exc)
        return results

    def generate(self, request: DecodeRequest) -> CountingGeneration:
        if request.max_new_tokens < 1:
            raise ValueError("length must be >= 1")
        gen = CountingGeneration(request.max_new_tokens, self.gate, self.log,
                                 request.input_ids[0])
        self.generations.append(gen)
        return gen


def request(tag: int, length: int) -> DecodeRequest:
    """Request `tag` emits `length` tokens, each `tag`."""
    return DecodeRequest([tag], SamplingParams(max_new_tokens=length), "plain", 0)


async def drain(ticket) -> list[StepEvent | ErrorEvent]:
    events = []
    while True:
        event = await asyncio.wait_for(ticket.events.get(), 5)
        events.append(event)
        if isinstance(event, ErrorEvent) or event.output.finished:
            return events


async def until(condition: Callable[[], bool], timeout: float = 5) -> None:
    """Wait for a state the engine thread reaches, not for a guessed duration."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "state not reached"
        await asyncio.sleep(0.001)


@pytest.fixture
def engine_and_scheduler():
    engine = CountingEngine()
    scheduler = Scheduler(engine, max_running=2, max_queue=2)
    scheduler.start()
    yield engine, scheduler
    engine.gate.set()
    scheduler.stop()


async def test_short_request_is_not_stuck_behind_a_long_one(engine_and_scheduler) -> None:
    engine, scheduler = engine_and_scheduler
    engine.gate.clear()
    long_run = scheduler.submit(request(1, 50))
    short_run = scheduler.submit(request(2, 3))
    engine.gate.set()
    short_events = await drain(short_run)
    long_events = await drain(long_run)
    assert len(short_events) == 3 and len(long_events) == 50
    # the short one finished within its first few turns, interleaved with the long one
    last_short = max(i for i, tag in enumerate(engine.log) if tag == 2)
    assert last_short <= 6
    assert scheduler.stats.requests_finished == 2
    assert scheduler.stats.generation_tokens == 53


async def test_queue_is_bounded_and_waiting_requests_are_fifo(engine_and_scheduler) -> None:
    engine, scheduler = engine_and_scheduler
    engine.gate.clear()
    running = [scheduler.submit(request(t, 5)) for t in (1, 2)]
    await until(lambda: scheduler.num_running == 2)  # admitted, then blocked in step()
    queued = [scheduler.submit(request(t, 1)) for t in (3, 4)]
    assert scheduler.num_running == 2 and scheduler.num_queued == 2
    with pytest.raises(Overloaded):
        scheduler.submit(request(5, 1))
    engine.gate.set()
    for ticket in running + queued:
        await drain(ticket)
    first_seen = [engine.log.index(t) for t in (3, 4)]
    assert first_seen == sorted(first_seen)


async def test_cancel_frees_the_slot_for_the_next_request(engine_and_scheduler) -> None:
    engine, scheduler = engine_and_scheduler
    endless = [scheduler.submit(request(t, 10_000)) for t in (1, 2)]
    waiting = scheduler.submit(request(3, 2))
    await asyncio.wait_for(endless[0].events.get(), 5)
    for ticket in endless:
        scheduler.cancel(ticket)
    events = await drain(waiting)
    assert events[-1].output.finished
    # the second may still be queued when cancelled (the engine thread admits what is
    # pending when it looks): then it never gets a generation, which is also freed
    endless_generations = [gen for gen in engine.generations if gen.tag != 3]
    assert endless_generations and all(gen.cancelled for gen in endless_generations)
    assert scheduler.stats.requests_aborted == 2


async def test_engine_errors_reach_the_request_and_the_thread_survives(
        engine_and_scheduler) -> None:
    _, scheduler = engine_and_scheduler
    bad = await drain(scheduler.submit(request(1, 0)))
    assert isinstance(bad[0], ErrorEvent) and "length" in str(bad[0].error)
    good = await drain(scheduler.submit(request(2, 1)))
    assert good[-1].output.finished


async def test_every_active_request_shares_each_step(engine_and_scheduler) -> None:
    engine, scheduler = engine_and_scheduler
    engine.gate.clear()
    tickets = [scheduler.submit(request(t, 4)) for t in (1, 2)]
    await until(lambda: scheduler.num_running == 2)
    engine.gate.set()
    for ticket in tickets:
        await drain(ticket)
    assert max(engine.batches) == 2 and engine.batches.count(2) >= 3


async def test_a_failing_request_leaves_the_batch_alone(engine_and_scheduler) -> None:
    engine, scheduler = engine_and_scheduler
    engine.gate.clear()
    failing, healthy = scheduler.submit(request(FAILING, 5)), scheduler.submit(request(2, 5))
    await until(lambda: scheduler.num_running == 2)
    engine.gate.set()
    failed = await drain(failing)
    assert isinstance(failed[-1], ErrorEvent) and "drafter broke" in str(failed[-1].error)
    assert len(failed) == 2 and engine.generations[0].cancelled
    done = await drain(healthy)
    assert [e.output.token_ids for e in done] == [[2]] * 5
