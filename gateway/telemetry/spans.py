"""OpenTelemetry traces of a request: one server span, a child span per phase, and the
W3C `traceparent` that carries the trace into the worker.

Spans of one generation request::

    chat {model}                 SERVER; parent: the client's traceparent, if it sent one
    ├── authenticate             the key (and the rate limit, `specroute.limited`)
    ├── classify                 the request profile
    ├── decide                   the policy, SLO-aware (`specroute.decision_reason`)
    ├── queue wait               admission, when the pool was full
    └── upstream call            CLIENT, one per worker tried; its context goes to the
        └── (worker spans)       worker as `traceparent` (workers/embedded: prefill, decode)

The server span carries the GenAI semantic-convention attributes (`gen_ai.operation.name`,
`gen_ai.request.*`, `gen_ai.usage.*`, `gen_ai.response.finish_reasons`) and specroute's own
(`specroute.tenant`, `.task`, `.pool`, `.method`, `.k`, `.accept_length`, `.verify_steps`,
`.ttft_ms`, `.slo_met`, `.decision_reason`, `.queued_ms`). No API key, no prompt and no
completion text are ever put on a span, except the prompt messages when the operator sets
`server.otel_capture_content: true`.

When no exporter is configured the provider is not `listening` and every request gets
`NO_TRACE`, whose methods do nothing: tracing off costs one attribute check a request.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

import orjson
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from policies.types import RequestRecord
from workers.tracer_provider import ListeningTracerProvider, tracer_provider

PROPAGATOR = TraceContextTextMapPropagator()
# The W3C trace headers of the upstream call in progress; `adapters/calls.post_ok` sends them.
UPSTREAM_TRACE_HEADERS: ContextVar[dict[str, str] | None] = ContextVar(
    "specroute_upstream_trace_headers", default=None)
OPERATION = {"chat": "chat", "completions": "text_completion"}


def make_tracer(exporter: str) -> tuple[ListeningTracerProvider, Tracer]:
    """The gateway's provider (workers/tracer_provider.py: exporter from the config or the
    standard OTEL_* variables) and its tracer."""
    provider = tracer_provider("specroute-gateway", exporter)
    return provider, provider.get_tracer("specroute.gateway")


class RequestTrace:
    """The live spans of one request."""

    __slots__ = ("tracer", "span", "context")

    def __init__(self, tracer: Tracer, name: str, parent: Context | None,
                 start_time: int | None = None) -> None:
        self.tracer = tracer
        self.span: Span = tracer.start_span(name, context=parent, kind=SpanKind.SERVER,
                                            start_time=start_time)
        self.context = set_span_in_context(self.span)

    @contextlib.contextmanager
    def phase(self, name: str, kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span | None]:
        span = self.tracer.start_span(name, context=self.context, kind=kind)
        try:
            yield span
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()

    @contextlib.contextmanager
    def upstream(self, worker: str, pool: str, k: int) -> Iterator[Span | None]:
        """A CLIENT span around one worker call; its traceparent goes with the call."""
        with self.phase("upstream call", SpanKind.CLIENT) as span:
            assert span is not None
            span.set_attributes({"server.address": worker, "specroute.pool": pool,
                                 "specroute.k": k})
            carrier: dict[str, str] = {}
            PROPAGATOR.inject(carrier, context=set_span_in_context(span))
            token = UPSTREAM_TRACE_HEADERS.set(carrier)
            try:
                yield span
            finally:
                UPSTREAM_TRACE_HEADERS.reset(token)

    def set(self, key: str, value: str | int | float | bool | list) -> None:
        self.span.set_attribute(key, value)

    def fail(self, status: int, code: str | None) -> None:
        """End the trace of a request refused before it was routed."""
        self.span.set_attribute("http.response.status_code", status)
        if code:
            self.span.set_attribute("error.type", code)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR, code or str(status)))
        self.span.end()

    def finish(self, record: RequestRecord, finish_reason: str | None = None,
               end_time: int | None = None) -> None:
        self.span.set_attributes(record_attributes(record))
        if finish_reason:
            self.span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        self.span.end(end_time=end_time)


NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


class NoTrace:
    """`RequestTrace` with nobody listening: every method does nothing."""

    __slots__ = ()

    def phase(self, name: str, kind: SpanKind = SpanKind.INTERNAL
              ) -> contextlib.AbstractContextManager[Span | None]:
        return NOTHING  # one shared, reusable context manager: no generator per call

    def upstream(self, worker: str, pool: str, k: int
                 ) -> contextlib.AbstractContextManager[Span | None]:
        return NOTHING

    def set(self, key: str, value: str | int | float | bool | list) -> None:
        pass

    def fail(self, status: int, code: str | None) -> None:
        pass

    def finish(self, record: RequestRecord, finish_reason: str | None = None,
               end_time: int | None = None) -> None:
        pass


NO_TRACE = NoTrace()
Trace = RequestTrace | NoTrace


def start_request(tracer: Tracer, provider: ListeningTracerProvider | None,
                  headers: list[tuple[bytes, bytes]], endpoint: str) -> Trace:
    """The request's server span, continuing the caller's trace (`traceparent`), or
    `NO_TRACE` when nobody listens."""
    if provider is not None and not provider.listening:
        return NO_TRACE
    carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in headers
               if name in (b"traceparent", b"tracestate")}
    parent = PROPAGATOR.extract(carrier) if carrier else None
    trace = RequestTrace(tracer, OPERATION.get(endpoint, endpoint), parent)
    trace.set("gen_ai.operation.name", OPERATION.get(endpoint, endpoint))
    return trace


def request_attributes(trace: Trace, request: object, capture_content: bool) -> None:
    """The GenAI request attributes, once the body is parsed (a `GenerationRequest`)."""
    if isinstance(trace, NoTrace):
        return
    model = getattr(request, "model", "")
    trace.span.update_name(f"{OPERATION.get(getattr(request, 'endpoint', ''), 'chat')} "
                           f"{model}")
    trace.set("gen_ai.request.model", model)
    for name in ("temperature", "max_tokens", "top_p"):
        value = getattr(request, name, None)
        if value is not None:
            trace.set(f"gen_ai.request.{name}", value)
    if capture_content:  # the operator opted in: prompts may hold personal data
        messages = getattr(request, "messages", None)
        prompt = messages if messages is not None else getattr(request, "prompt", None)
        trace.set("gen_ai.input.messages", orjson.dumps(prompt).decode())


def record_attributes(record: RequestRecord) -> dict[str, str | int | float | bool]:
    attributes: dict[str, str | int | float | bool] = {
        "specroute.pool": record.pool, "specroute.method": record.method,
        "specroute.k": record.k, "specroute.task": record.task,
        "specroute.tenant": record.tenant, "specroute.accept_length": record.accept_length,
        "specroute.ttft_ms": round(record.ttft_s * 1000, 3),
        "specroute.slo_met": record.slo_met, "specroute.ok": record.ok,
        "gen_ai.usage.input_tokens": record.prompt_tokens,
        "gen_ai.usage.output_tokens": record.output_tokens,
        "gen_ai.request.model": record.model,
    }
    if record.verify_steps is not None:  # None: the worker did not report it
        attributes["specroute.verify_steps"] = record.verify_steps
    return attributes
