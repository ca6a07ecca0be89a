"""One admitted request on the HTTP side: its ticket, its output so far, its SSE body.

The engine validates the request once (`GenerationEngine.validate`, method and k
resolved there); the scheduler's thread steps it; this object turns the events that come
back into WorkerErrors or accumulated output, and cancels the generation when the
client goes away.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.requests import Request

from workers.embedded import responses
from workers.embedded.api import DecodeRequest, EngineInputError, TokenLogprob
from workers.embedded.context import WorkerState
from workers.embedded.errors import BadRequest, ClientDisconnected, WorkerError
from workers.embedded.parsing import GenerateRequest
from workers.embedded.scheduler import ErrorEvent, StepEvent, Ticket
from workers.embedded.spans import WorkerTrace

Chunks = Callable[["Run", StepEvent], list[Any]]
Tail = Callable[[list["Run"], list[StepEvent]], list[Any]]  # every sample's last step
log = logging.getLogger("specroute.worker")


class Run:
    """One admitted request: its ticket, its accumulated output, and the event stream."""

    def __init__(self, state: WorkerState, req: GenerateRequest, index: int = 0,
                 trace: WorkerTrace | None = None) -> None:
        self.state, self.req, self.index = state, req, index
        self.trace = trace  # the request's spans when traces are exported
        self.started = time.perf_counter()
        self.ticket: Ticket | None = None
        self.text = ""
        self.output_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.done = False
        self.speculative = False

    def submit(self) -> None:
        """Have the engine validate the request, then queue it (BadRequest, Overloaded)."""
        engine, req = self.state.engine, self.req
        prompt = req.input_ids if req.input_ids is not None else req.text
        assert prompt is not None, "parsing gives text or input_ids"
        try:
            request = engine.validate(prompt, req.sampling, req.method or self.state.config.method,
                                      req.k)
        except EngineInputError as exc:
            raise BadRequest(str(exc)) from exc
        _check_context(request, engine.max_context, req.sampling.max_new_tokens)
        self.speculative = request.speculative
        self.ticket = self.state.scheduler.submit(request)

    async def next_event(self) -> StepEvent:
        """The next step; an engine failure becomes a WorkerError (500)."""
        assert self.ticket is not None
        event = await self.ticket.events.get()
        if isinstance(event, ErrorEvent):
            self.done = True
            if self.trace is not None:
                self.trace.finish(None, "engine failure")
            raise WorkerError(f"engine failure: {event.error}") from event.error
        self.text += event.output.text
        self.output_ids.extend(event.output.token_ids)
        self.logprobs.extend(event.output.logprobs or ())
        self.done = event.output.finished
        if self.trace is not None:
            self.trace.first_step()
            if self.done:
                self.trace.finish(event.stats)
        if self.done:
            self._log_finished(event)
        return event

    def _log_finished(self, event: StepEvent) -> None:
        """One info line per request: sizes, time and speculation, never the text."""
        stats = event.stats
        log.info("request %r done: method %s k %s, %d prompt + %d output tokens in %.3f s, "
                 "%d verify steps (accept length %.2f)", self.req.rid[:64],
                 self.req.method or self.state.config.method,
                 "default" if self.req.k is None else self.req.k, stats.prompt_tokens,
                 stats.completion_tokens, time.perf_counter() - self.started,
                 stats.verify_steps, stats.accept_length)

    def meta_info(self, event: StepEvent) -> dict[str, Any]:
        return responses.meta_info(self.req.rid, event.output, event.stats, self.started,
                                   self.speculative)

    def cancel(self) -> None:
        if self.ticket is not None and not self.done:
            self.state.scheduler.cancel(self.ticket)
            self.done = True
            log.info("request %r cancelled after %d output tokens, %.3f s", self.req.rid[:64],
                     len(self.output_ids), time.perf_counter() - self.started)
        if self.trace is not None:
            self.trace.finish(None, "cancelled")

    async def to_end(self, event: StepEvent) -> StepEvent:
        while not event.output.finished:
            event = await self.next_event()
        return event


Admitted = list[tuple[Run, StepEvent]]


async def finish_all(request: Request, admitted: Admitted) -> list[StepEvent]:
    """Run every admitted request to its end; a client that disconnects meanwhile cancels
    them all (`ClientDisconnected`: an answer nobody reads, not a CancelledError that the
    server would log as a crashed application)."""
    watcher: asyncio.Future[Any] = asyncio.ensure_future(_disconnected(request))
    work: asyncio.Future[Any] = asyncio.ensure_future(
        asyncio.gather(*(run.to_end(e) for run, e in admitted)))
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            work.cancel()
            # the gather ends with its samples' CancelledError: read it, or asyncio logs
            # "exception was never retrieved" with a traceback
            work.add_done_callback(_retrieve)
            raise ClientDisconnected("the client disconnected")
        return work.result()
    finally:
        watcher.cancel()
        for run, _ in admitted:
            run.cancel()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _check_context(request: DecodeRequest, context: int, asked: int | None) -> None:
    """SGLang refuses a request whose prompt + max_new_tokens overflows the context, where
    the engine would stop at the context's end (tokenizer_manager.py)."""
    if asked is not None and len(request.input_ids) + asked > context:
        raise BadRequest(f"Requested token count exceeds the model's maximum context length "
                         f"of {context} tokens: {len(request.input_ids)} input + {asked} "
                         f"new tokens.")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def admit(state: WorkerState, req: GenerateRequest,
                trace: WorkerTrace | None = None) -> Admitted:
    """Submit the request's n samples (seeded seed, seed + 1, ... when a seed is given) and
    wait for each one's first step, so bad input is a 400 before any stream starts. The
    trace, when exported, follows the first sample."""
    runs: list[Run] = []
    try:
        for i in range(req.n):
            sampling = req.sampling
            if i and sampling.seed is not None:
                sampling = dataclasses.replace(sampling, seed=sampling.seed + i)
            runs.append(Run(state, dataclasses.replace(req, sampling=sampling), i,
                            trace if i == 0 else None))
            try:
                runs[-1].submit()
            except BaseException:
                if i == 0 and trace is not None:
                    trace.finish(None, "refused")
                raise
        return list(zip(runs, await asyncio.gather(*(r.next_event() for r in runs)),
                        strict=True))
    except BaseException:
        for run in runs:
            run.cancel()
        raise


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def _pump(run: Run, first: StepEvent,
                queue: asyncio.Queue[tuple[Run, StepEvent | WorkerError]]) -> None:
    event = first
    try:
        while True:
            await queue.put((run, event))
            if event.output.finished:
                return
            event = await run.next_event()
    except WorkerError as exc:
        await queue.put((run, exc))


async def sse_stream(admitted: Admitted, chunks: Chunks, tail: Tail) -> AsyncIterator[bytes]:
    """SSE body: chunks per step of each sample as they come, then the tail chunks after
    the last sample's last step; cancels everything on disconnect."""
    queue: asyncio.Queue[tuple[Run, StepEvent | WorkerError]] = asyncio.Queue()
    pumps = [asyncio.ensure_future(_pump(run, first, queue)) for run, first in admitted]
    finals: dict[int, StepEvent] = {}
    try:
        while len(finals) < len(admitted):
            run, item = await queue.get()
            if isinstance(item, WorkerError):
                raise item
            for chunk in chunks(run, item):
                yield _sse(chunk)
            if item.output.finished:
                finals[run.index] = item
        for chunk in tail([run for run, _ in admitted], [finals[i] for i in sorted(finals)]):
            yield _sse(chunk)
    except WorkerError as exc:
        yield _sse({"error": {"message": str(exc), "type": "invalid_request_error",
                              "code": exc.status_code, "retryable": False}})
    finally:
        for pump in pumps:
            pump.cancel()
        for run, _ in admitted:
            run.cancel()
    yield DONE
