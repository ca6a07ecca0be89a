"""The engine thread: owns the Engine and steps all active generations together.

The torch work never runs on the event loop. One thread starts requests and, every
scheduler step, hands all active generations to `GenerationEngine.step`, which runs one batched
target forward for all of them (each with its own drafter, k and tree), so a short request
finishes while a long one is still decoding and concurrent requests share each forward, as
in the continuous batching of Orca (OSDI 2022), vLLM and SGLang. New requests join at step
boundaries (their prefill rides in the same forward); a cancelled one leaves at the next.
At most `max_running` generations are active; the rest wait in a bounded FIFO queue whose
depth, with the running count, is the worker's load signal. Each step's output goes back
to the request's asyncio queue through `loop.call_soon_threadsafe`.

Events a request receives, in order: zero or more `StepEvent`s, the last with
`output.finished` true; or one `ErrorEvent` (bad input found by the engine, or an
engine failure) and nothing after it.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import threading
from dataclasses import dataclass, field

from workers.embedded.api import (
    DecodeRequest,
    GenerationEngine,
    GenerationStats,
    RunningGeneration,
    StepOutput,
)
from workers.embedded.errors import Overloaded

logger = logging.getLogger(__name__)


@dataclass
class StepEvent:
    output: StepOutput
    stats: GenerationStats  # a copy taken after this step


@dataclass
class ErrorEvent:
    error: BaseException


@dataclass
class SchedulerStats:
    """Cumulative counters since start, read by /metrics and /server_info."""

    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    verify_steps: int = 0
    num_correct_drafts: int = 0
    num_proposed_drafts: int = 0
    # branch -> [steps, accepted draft tokens] of multi-drafter requests (hybrid)
    draft_branches: dict[str, list[int]] = field(default_factory=dict)
    # (completion_tokens, verify_steps, correct, proposed) of the last finished requests
    recent: collections.deque[tuple[int, int, int, int]] = field(default_factory=lambda: collections.deque(maxlen=64))

    def recent_accept_length(self) -> float:
        """Tokens per verify step over the recent window (SGLang's `spec_accept_length`)."""
        tokens = sum(r[0] for r in self.recent)
        steps = sum(r[1] for r in self.recent)
        return tokens / steps if steps else 0.0

    def recent_accept_rate(self) -> float:
        """Accepted / proposed draft tokens over the recent window."""
        correct = sum(r[2] for r in self.recent)
        proposed = sum(r[3] for r in self.recent)
        return correct / proposed if proposed else 0.0


class Ticket:
    """One request's place in the scheduler; the asyncio side reads `events`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, request: DecodeRequest) -> None:
        self.loop = loop
        self.events: asyncio.Queue[StepEvent | ErrorEvent] = asyncio.Queue()
        self.request = request
        self.cancelled = threading.Event()
        self.generation: RunningGeneration | None = None

    def deliver(self, event: StepEvent | ErrorEvent) -> None:
        """Called on the engine thread; hands the event to the event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # loop closed during shutdown; nobody is listening
            pass


class Scheduler:
    """Batched stepping of up to `max_running` generations on one thread."""

    def __init__(self, engine: GenerationEngine, max_running: int = 4, max_queue: int = 64) -> None:
        self.engine = engine
        self.max_running = max_running
        self.max_queue = max_queue
        self.stats = SchedulerStats()
        self._pending: collections.deque[Ticket] = collections.deque()
        self._active: list[Ticket] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def num_running(self) -> int:
        return len(self._active)

    @property
    def num_queued(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def submit(self, request: DecodeRequest) -> Ticket:
        """Queue a validated request; raises Overloaded when the queue is full. Call on the
        event loop."""
        ticket = Ticket(asyncio.get_running_loop(), request)
        with self._cond:
            free_slots = max(0, self.max_running - len(self._active))
            if len(self._pending) >= self.max_queue + free_slots:
                raise Overloaded(f"the worker queue is full ({self.max_queue} waiting requests)")
            self._pending.append(ticket)
            self._cond.notify()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Free the request's slot (client went away). Safe to call more than once."""
        ticket.cancelled.set()
        with self._cond:
            if ticket in self._pending:
                self._pending.remove(ticket)
                self.stats.requests_aborted += 1
            self._cond.notify()

    # ---------------------------------------------------------------- engine thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._pending or self._active):
                    self._cond.wait()
                if self._stopping:
                    break
                admitted: list[Ticket] = []
                while self._pending and len(self._active) + len(admitted) < self.max_running:
                    admitted.append(self._pending.popleft())
            for ticket in admitted:
                self._admit(ticket)
            self._step(list(self._active))
        for ticket in self._active:
            if ticket.generation is not None:
                ticket.generation.cancel()

    def _admit(self, ticket: Ticket) -> None:
        try:
            ticket.generation = self.engine.generate(ticket.request)
        except Exception as exc:  # reaches the request as an engine failure (HTTP 500)
            logger.exception("engine start failed")
            ticket.deliver(ErrorEvent(exc))
            return
        self.stats.prompt_tokens += len(ticket.request.input_ids)
        with self._cond:
            self._active.append(ticket)

    def _step(self, tickets: list[Ticket]) -> None:
        """One batched step of every active, uncancelled request."""
        batch: list[tuple[Ticket, RunningGeneration]] = []
        for ticket in tickets:
            generation = ticket.generation
            assert generation is not None, "stepped only once admitted"
            if ticket.cancelled.is_set():
                generation.cancel()
                self._retire(ticket)
                self.stats.requests_aborted += 1
            else:
                batch.append((ticket, generation))
        if not batch:
            return
        try:
            results = self.engine.step([generation for _, generation in batch])
        except Exception as exc:  # the engine could not isolate it: fails the whole batch
            logger.exception("engine step failed")
            results = [exc] * len(batch)
        for (ticket, generation), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                logger.error("engine step failed", exc_info=result)
                generation.cancel()
                self._retire(ticket)
                ticket.deliver(ErrorEvent(result))
                continue
            stats = copy.copy(generation.stats)
            self.stats.generation_tokens += len(result.token_ids)
            if result.finished:
                self._retire(ticket)
                self._record(stats)
            if result.token_ids or result.finished:  # else a prefill chunk: nothing to say
                ticket.deliver(StepEvent(result, stats))

    def _retire(self, ticket: Ticket) -> None:
        with self._cond:
            self._active.remove(ticket)

    def _record(self, stats: GenerationStats) -> None:
        s = self.stats
        s.requests_finished += 1
        s.verify_steps += stats.verify_steps
        s.num_correct_drafts += stats.num_correct_drafts
        s.num_proposed_drafts += stats.num_proposed_drafts
        s.recent.append((stats.completion_tokens, stats.verify_steps,
                         stats.num_correct_drafts, stats.num_proposed_drafts))
        for branch, counts in stats.branches().items():
            total = s.draft_branches.setdefault(branch, [0, 0])
            total[0] += counts["steps"]
            total[1] += counts["accepted"]
