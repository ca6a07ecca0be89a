"""One ext_proc stream: one HTTP request through Envoy, from its headers to its end.

Envoy sends, in order (the filter's processing mode, docs/PICKER.md): the request
headers, the whole request body (`BUFFERED`), the response headers, the response body
chunk by chunk (`STREAMED`). The request side decides (`gateway.picker.decide`) and
answers the body with the endpoints, or with an ImmediateResponse (an OpenAI-shaped
error: 4xx as the gateway would answer, 429 shed, 503 no ready endpoint). The response
side learns which endpoint served (`x-gateway-destination-endpoint-served`) and reads
the usage and speculation counters as the body passes, and at the end the request is
recorded as the gateway records it (`gateway.telemetry.record`): the policy learns in
picker mode too. The admission slot and the worker's outstanding count are held from
the pick to the end of the stream, however it ends.
"""

from __future__ import annotations

import logging
import time

from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from gateway.errors import (
    GatewayError,
    NoHealthyWorker,
    error_body,
    internal_error,
    retry_after,
)
from gateway.http.responses import headers_for
from gateway.picker import protocol
from gateway.picker.decide import Pick, any_worker, decide, route_of, served_decision
from gateway.picker.reading import ResponseReader
from gateway.picker.services import PickerServices
from gateway.pools import Pool, Worker
from gateway.telemetry.record import Outcome
from gateway.telemetry.spans import NO_TRACE, request_attributes, start_request

log = logging.getLogger("specroute.picker")


def refusal(exc: GatewayError) -> ext.ProcessingResponse:
    headers = [("retry-after", after)] if (after := retry_after(exc)) is not None else []
    return protocol.immediate(exc.status, error_body(exc), headers,
                              details=f"specroute_{exc.code or 'error'}")


class Exchange:
    """Answers one stream's messages (`handle`); `close` when the stream ends."""

    def __init__(self, services: PickerServices, max_endpoints: int | None = None) -> None:
        self.services = services
        self.budget = max_endpoints or services.max_endpoints
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.pick: Pick | None = None
        self.reader = ResponseReader()
        self.status = 0
        self.served: tuple[Pool, Worker] | None = None
        self.closed = False

    async def handle(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse | None:
        """The answer to one message; None where Envoy expects none."""
        kind = message.WhichOneof("request")
        try:
            if kind == "request_headers":
                return await self._request_headers(message)
            if kind == "request_body":
                return await self._request_body(message)
            if kind == "response_headers":
                return self._response_headers(message)
            if kind == "response_body":
                return self._response_body(message)
            if kind in ("request_trailers", "response_trailers"):
                return protocol.go_on(kind)
        except GatewayError as exc:
            if self.pick is not None:
                self.pick.trace.fail(exc.status, exc.code)
            return refusal(exc)
        return None

    async def _request_headers(self, message: ext.ProcessingRequest
                               ) -> ext.ProcessingResponse:
        headers = self.headers = protocol.header_map(message.request_headers)
        route = route_of(headers.get(":path", ""))
        # a generation's span continues the caller's trace (Envoy forwards traceparent)
        trace = NO_TRACE if route is None else start_request(
            self.services.tracer, self.services.provider,
            [(k.encode(), v.encode("latin-1", "replace")) for k, v in headers.items()
             if k in ("traceparent", "tracestate")],
            "completions" if route == "generate" else route)
        try:
            with trace.phase("authenticate"):
                tenant = self.services.auth.tenant(headers.get("authorization"))
        except GatewayError as exc:
            trace.fail(exc.status, exc.code)
            raise
        trace.set("specroute.tenant", tenant.name)
        self.pick = Pick(tenant, None, None, None, [], trace=trace)
        if route is not None and headers.get(":method") == "POST" \
                and not message.request_headers.end_of_stream:
            return protocol.go_on("request_headers")  # the body decides
        # not a generation (GET /v1/models, ...): any ready worker, nothing to learn
        self.pick.targets = any_worker(self.services, self.budget)
        if not self.pick.targets:
            raise no_endpoint()
        return header_pick(self.pick.endpoints)

    async def _request_body(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        assert self.pick is not None
        if self.pick.targets:  # placed at the headers (not a generation): pass it on
            return protocol.go_on("request_body")
        self.body += message.request_body.body
        if not message.request_body.end_of_stream:
            return protocol.go_on("request_body")  # STREAMED chunks: wait for the end
        subset = protocol.subset_hint(message, self.headers)
        pick = await decide(self.services, self.headers, bytes(self.body), subset, self.pick,
                            self.budget)
        assert pick.request is not None and pick.decision is not None
        request_attributes(pick.trace, pick.request,
                           self.services.config.server.otel_capture_content)
        self.reader.streaming = pick.request.stream
        return protocol.pick(pick.endpoints, pick.body)

    def _response_headers(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        headers = protocol.header_map(message.response_headers)
        self.status = int(headers.get(":status", "0") or 0)
        self.reader.streaming = headers.get("content-type", "").startswith(
            "text/event-stream")
        pick = self.pick
        if pick is None or pick.decision is None:
            return protocol.go_on("response_headers")
        served = protocol.served_endpoint(message, headers)
        self.served = self.services.worker_at(served) if served else None
        if self.served is None:
            self.served = pick.targets[0]
        pool = self.served[0]
        pick.decision = served_decision(pick.decision, pool, f"failover to {pool.name}")
        extra = [(k.decode(), v.decode("latin-1")) for k, v in headers_for(pick.decision)]
        if message.response_headers.end_of_stream:
            self._finish()
        return protocol.go_on("response_headers", extra)

    def _response_body(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        pick = self.pick
        if pick is not None and pick.decision is not None:
            body = message.response_body
            self.reader.feed(body.body)
            if self.reader.tokens_seen:
                pick.timer.token()
            if body.end_of_stream:
                self.reader.finish()
                self._finish()
        return protocol.go_on("response_body")

    def _finish(self) -> None:
        """Record the request once, release what it held (also from `close`)."""
        if self.closed:
            return
        self.closed = True
        pick = self.pick
        if pick is None or pick.decision is None or pick.request is None:
            return
        now = time.monotonic()
        primary = pick.targets[0][1]
        primary.outstanding -= 1
        if self.services.admission is not None and pick.ticket is not None:
            self.services.admission.leave(pick.ticket)
        served = self.served
        if served is not None and served[1] is not primary:
            primary.breaker.failure(now)  # Envoy went past it: refused or failed
        ok = self.status == 200 and (self.reader.done or self.reader.usage.completion_tokens > 0)
        if served is not None:
            if self.status >= 500 or self.status == 0:
                served[1].breaker.failure(now)
            else:
                served[1].breaker.success()
        outcome = Outcome(pick.request, pick.profile, pick.tenant,  # type: ignore[arg-type]
                          pick.decision, pick.timer, load=pick.load, workers=pick.workers,
                          usage=self.reader.usage, spec=self.reader.spec, ok=ok,
                          finish_reason=self.reader.finish_reason)
        if not ok:
            pick.trace.set("http.response.status_code", self.status or 502)
        self.services.reporter.record(outcome, pick.trace)

    def close(self) -> None:
        """The stream ended (the client left, Envoy gave up, or the response is done)."""
        try:
            self._finish()
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the stream hanging
            log.error("picker: finishing a request failed: %s", internal_error(exc, "picker"))


def no_endpoint() -> GatewayError:
    return NoHealthyWorker("no ready endpoint", code="no_healthy_worker")


def header_pick(endpoints: list[str]) -> ext.ProcessingResponse:
    """A pick answered at the request headers (no body to wait for)."""
    answer = protocol.pick(endpoints)
    common = answer.request_body.response
    return ext.ProcessingResponse(request_headers=ext.HeadersResponse(response=common),
                                  dynamic_metadata=answer.dynamic_metadata)
