"""The worker's part of a request's trace: it continues the caller's W3C `traceparent`.

Spans (only when an exporter is configured, workers/tracer_provider.py)::

    worker {route}        SERVER; parent: the gateway's "upstream call" span
    ├── prefill           admission to the first step's output (scheduler queue included)
    └── decode            first step to the last: verify steps, drafts proposed and
                          accepted, accept length, summarized (not one span per step)

No prompt or output text goes on a span.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from workers.embedded.api import GenerationStats

PROPAGATOR = TraceContextTextMapPropagator()


class WorkerTrace:
    """The spans of one request on this worker; each method is safe to call twice."""

    def __init__(self, tracer: Tracer, headers: Mapping[str, str], route: str,
                 method: str, k: int | None) -> None:
        carrier = {name: headers[name] for name in ("traceparent", "tracestate")
                   if name in headers}
        self.tracer = tracer
        self.root = tracer.start_span(f"worker {route}", context=PROPAGATOR.extract(carrier),
                                      kind=SpanKind.SERVER)
        self.root.set_attributes({"specroute.method": method,
                                  "specroute.k": -1 if k is None else k})
        self.context = set_span_in_context(self.root)
        self.started_ns = time.time_ns()
        self.first_ns = 0
        self.done = False

    def first_step(self) -> None:
        if self.first_ns:
            return
        self.first_ns = time.time_ns()
        span = self.tracer.start_span("prefill", context=self.context,
                                      start_time=self.started_ns)
        span.end(end_time=self.first_ns)

    def finish(self, stats: GenerationStats | None, error: str | None = None) -> None:
        """End the decode summary and the request's span (`error`: why it stopped early)."""
        if self.done:
            return
        self.done = True
        now = time.time_ns()
        decode = self.tracer.start_span("decode", context=self.context,
                                        start_time=self.first_ns or now)
        if stats is not None:
            summary = {"gen_ai.usage.input_tokens": stats.prompt_tokens,
                       "gen_ai.usage.output_tokens": stats.completion_tokens,
                       "specroute.verify_steps": stats.verify_steps,
                       "specroute.accept_length": stats.accept_length,
                       "specroute.drafts_proposed": stats.num_proposed_drafts,
                       "specroute.drafts_accepted": stats.num_correct_drafts}
            decode.set_attributes(summary)
            self.root.set_attributes(summary)
        if error is not None:
            self.root.set_status(Status(StatusCode.ERROR, error))
        decode.end(end_time=now)
        self.root.end(end_time=now)
