"""One admitted request on the HTTP side: its ticket, its output so far, its SSE body.

The engine validates the request once (`GenerationEngine.validate`, method and k
resolved there); the scheduler's thread steps it; this object turns the events that come
back into WorkerErrors or accumulated output, and cancels the generation when the
client goes away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.requests import Request

from workers.embedded import responses
from workers.embedded.api import DecodeRequest, EngineInputError
from workers.embedded.errors import BadRequest, WorkerError
from workers.embedded.requests import GenerateRequest
from workers.embedded.scheduler import ErrorEvent, StepEvent, Ticket
from workers.embedded.state import WorkerState
from workers.embedded.tracing import WorkerTrace

Chunks = Callable[["Run", StepEvent], list[Any]]
log = logging.getLogger("specroute.worker")


class Run:
    """One admitted request: its ticket, its accumulated output, and the event stream."""

    def __init__(self, state: WorkerState, req: GenerateRequest,
                 trace: WorkerTrace | None = None) -> None:
        self.state, self.req = state, req
        self.trace = trace  # the request's spans when traces are exported
        self.started = time.perf_counter()
        self.ticket: Ticket | None = None
        self.text = ""
        self.output_ids: list[int] = []
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

    async def final(self, request: Request) -> StepEvent:
        """Run to the end; a client that disconnects meanwhile cancels the generation."""
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                step = asyncio.ensure_future(self.next_event())
                done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    self.cancel()
                    raise asyncio.CancelledError
                event = step.result()
                if event.output.finished:
                    return event
        finally:
            watcher.cancel()
            self.cancel()


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
                trace: WorkerTrace | None = None) -> tuple[Run, StepEvent]:
    """Submit and wait for the first step, so bad input is a 400 before any stream starts."""
    run = Run(state, req, trace)
    try:
        run.submit()
    except BaseException:
        if trace is not None:
            trace.finish(None, "refused")
        raise
    try:
        return run, await run.next_event()
    except BaseException:
        run.cancel()
        raise


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def sse_stream(run: Run, first: StepEvent, chunks: Chunks,
                     tail: Chunks) -> AsyncIterator[bytes]:
    """SSE body: chunks per step, tail chunks after the last; cancels on disconnect."""
    event = first
    try:
        while True:
            for chunk in chunks(run, event):
                yield _sse(chunk)
            if event.output.finished:
                break
            event = await run.next_event()
        for chunk in tail(run, event):
            yield _sse(chunk)
    except WorkerError as exc:
        yield _sse({"error": {"message": str(exc), "type": "invalid_request_error",
                              "code": exc.status_code, "retryable": False}})
    finally:
        run.cancel()
    yield DONE
