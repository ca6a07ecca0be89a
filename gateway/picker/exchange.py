"""One ext_proc stream: one HTTP request through Envoy, from its headers to its end.

Envoy sends, in order (the filter's processing mode, docs/PICKER.md): the request
headers, the request body, the response headers, the response body chunk by chunk
(`STREAMED`). The request side decides on the whole body (`gateway.picker.place`) and
answers with the endpoints, or with an ImmediateResponse (an OpenAI-shaped error: 4xx as
the gateway would answer, 429 shed, 503 no ready endpoint). With a `BUFFERED` body the
pick answers the body; with `FULL_DUPLEX_STREAMED` (GAIE's Envoy Gateway setting) or
`STREAMED` sent without waiting, Envoy does not wait for the headers' answer, so it is
held until the body is in, then the pick answers the headers and the chunks follow (in
full duplex the body itself goes back: Envoy forwards only what the processor returns).
The response side learns which endpoint served (`x-gateway-destination-endpoint-served`) and reads
the usage and speculation counters as the body passes, and at the end the request is
recorded as the gateway records it (`gateway.telemetry.record`): the policy learns in
picker mode too. With the response read by an observer filter (`observe`, Envoy's
`observability_mode`: nothing waited on), the picking stream ends at the pick and the
observer's stream, which names the exchange in a request header, brings the response. The admission slot and the worker's outstanding count are held from
the pick to the end of the stream, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext

from gateway.errors import (
    GatewayError,
    NoHealthyWorker,
    body_too_large,
    error_body,
    internal_error,
    retry_after,
)
from gateway.http.responses import headers_for
from gateway.picker import protocol
from gateway.picker.place import Pick, any_worker, place, route_of
from gateway.picker.reading import ResponseReader
from gateway.picker.runtime import PickerServices
from gateway.pools import Pool, Worker, served
from gateway.telemetry.record import Outcome
from gateway.telemetry.spans import NO_TRACE, start_request

BodySendMode = ProcessingMode.BodySendMode
log = logging.getLogger("specroute.picker")
# how long a finished picking stream waits for its observer's stream (the response side,
# `observe`) before it records the request without the response
OBSERVER_WAIT_S = 10.0


def refusal(exc: GatewayError) -> ext.ProcessingResponse:
    headers = [("retry-after", after)] if (after := retry_after(exc)) is not None else []
    return protocol.immediate(exc.status, error_body(exc), headers,
                              details=f"specroute_{exc.code or 'error'}")


class Exchange:
    """Answers one stream's messages (`handle`); `close` when the stream ends."""

    def __init__(self, services: PickerServices, max_endpoints: int | None = None,
                 response: str = "") -> None:
        self.services = services
        # the response comes through an observer's stream (`observe`), not this one
        self.observed = response == "observed"
        # the response headers reach the client without the picker (`observed`, `body`):
        # the route sets the decision headers from the pick's dynamic metadata
        self.headers_from_metadata = response in ("observed", "body")
        self.key: str | None = None  # this exchange's name to its observer
        self.watched = False  # the observer has come
        self.wait: asyncio.TimerHandle | None = None
        self.budget = max_endpoints or services.max_endpoints
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.pick: Pick | None = None
        self.reader = ResponseReader()
        self.status = 0
        self.served: tuple[Pool, Worker] | None = None
        self.closed = False
        self.subset: set[str] | None = None
        self.placed = False  # the pick has been answered
        self.chunks = 0  # request body messages seen
        self.deferred = self.duplex_request = self.duplex_response = False
        self.refused = False
        self.body_seen = False  # some response body reached the picker

    async def handle(self, message: ext.ProcessingRequest) -> list[ext.ProcessingResponse]:
        """The answers this message releases, in order: usually its own; none while a
        deferred request's body is still coming; then the headers' and every chunk's."""
        kind = message.WhichOneof("request")
        if self.refused:  # answered already; Envoy sends nothing more, a test might
            return []
        if message.HasField("protocol_config"):  # on the stream's first message
            self._modes(message.protocol_config)
        if self.subset is None:
            self.subset = protocol.subset_hint(message)
        try:
            if kind == "request_headers":
                return await self._request_headers(message)
            if kind == "request_body":
                return await self._request_body(message)
            if kind == "request_trailers":
                return await self._request_trailers()
            if kind == "response_headers":
                return [self._response_headers(message)]
            if kind == "response_body":
                return [self._response_body(message)]
            if kind == "response_trailers":
                return [protocol.go_on(kind)]
        except GatewayError as exc:
            return self._refuse(exc)
        except Exception as exc:  # noqa: BLE001 - a bug: logged, the client told (500)
            return self._refuse(internal_error(exc, "picker"))
        return []

    def _refuse(self, exc: GatewayError) -> list[ext.ProcessingResponse]:
        if self.pick is not None:
            self.pick.trace.fail(exc.status, exc.code)
        self.refused = True
        return [refusal(exc)]

    def _modes(self, config: ext.ProtocolConfiguration) -> None:
        """The filter's body modes (Envoy states them on the first message): in
        FULL_DUPLEX_STREAMED, and in STREAMED with `send_body_without_waiting_for_header_
        response`, the headers' answer is held until the whole body is in (the pick
        needs it), and Envoy forwards, in full duplex, only the body sent back."""
        request = config.request_body_mode
        self.duplex_request = request == BodySendMode.FULL_DUPLEX_STREAMED
        self.deferred = self.duplex_request or (
            request == BodySendMode.STREAMED
            and config.send_body_without_waiting_for_header_response)
        self.duplex_response = config.response_body_mode == BodySendMode.FULL_DUPLEX_STREAMED

    async def _request_headers(self, message: ext.ProcessingRequest
                               ) -> list[ext.ProcessingResponse]:
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
        self.pick = Pick(tenant, trace=trace)
        if route is not None and headers.get(":method") == "POST" \
                and not message.request_headers.end_of_stream:
            # the body decides; held until it is in when Envoy sends it without waiting
            return [] if self.deferred else [protocol.go_on("request_headers")]
        # not a generation (GET /v1/models, ...): any ready worker, nothing to learn
        self.pick.targets = any_worker(self.services, self.budget)
        if not self.pick.targets:
            raise no_endpoint()
        self.placed = True
        return [protocol.pick(self.pick.endpoints, phase="request_headers")]

    async def _request_body(self, message: ext.ProcessingRequest
                            ) -> list[ext.ProcessingResponse]:
        body = message.request_body
        if self.placed:  # placed at the headers (not a generation): pass it on
            return [protocol.streamed("request_body", body.body, body.end_of_stream)
                    if self.duplex_request else protocol.go_on("request_body")]
        self.body += body.body
        self.chunks += 1
        if len(self.body) > self.services.config.server.max_body_bytes:
            raise body_too_large(self.services.config.server.max_body_bytes)
        if not body.end_of_stream:
            # BUFFERED never gets here; a STREAMED chunk that Envoy waits on is passed
            # (the pick then comes too late: a listener must buffer, or send without waiting)
            return [] if self.deferred else [protocol.go_on("request_body")]
        return await self._place()

    async def _request_trailers(self) -> list[ext.ProcessingResponse]:
        """Trailers end a deferred body that did not say end_of_stream."""
        answers = await self._place() if self.deferred and not self.placed else []
        return [*answers, protocol.go_on("request_trailers")]

    async def _place(self) -> list[ext.ProcessingResponse]:
        """Decide on the whole body; the answers for the messages held so far."""
        assert self.pick is not None
        pick = await place(self.services, self.headers, bytes(self.body), self.subset,
                           self.pick, self.budget)
        self.placed = True
        assert pick.job is not None
        self.reader.streaming = pick.job.request.stream
        headers: list[tuple[str, str]] = []
        metadata: list[tuple[str, str]] = []
        if self.observed:  # the observer finds this exchange by the header's value
            self.key = secrets.token_hex(12)
            self.services.exchanges[self.key] = self
            headers.append((protocol.EXCHANGE, self.key))
        if self.headers_from_metadata:
            metadata = [(k.decode(), v.decode()) for k, v in headers_for(pick.job.decision)]
        if not self.deferred:
            return [protocol.pick(pick.endpoints, pick.body, headers, metadata=metadata)]
        answers = [protocol.pick(pick.endpoints, pick.body, headers, "request_headers",
                                 metadata)]
        if self.duplex_request:  # Envoy forwards what comes back: the (new) body, whole
            return [*answers, protocol.streamed("request_body", pick.body or bytes(self.body),
                                                True)]
        if pick.body is None:
            return [*answers, *(protocol.go_on("request_body") for _ in range(self.chunks))]
        return [*answers, protocol.replaced("request_body", pick.body),
                *(protocol.replaced("request_body", None) for _ in range(self.chunks - 1))]

    def _response_headers(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        headers = protocol.header_map(message.response_headers)
        self.status = int(headers.get(":status", "0") or 0)
        self.reader.streaming = headers.get("content-type", "").startswith(
            "text/event-stream")
        pick = self.pick
        if pick is None or pick.job is None:
            return protocol.go_on("response_headers")
        self._served(message, headers)
        extra = [(k.decode(), v.decode("latin-1")) for k, v in headers_for(pick.job.decision)]
        if message.response_headers.end_of_stream:
            self._finish()
        return protocol.go_on("response_headers", extra)

    def _served(self, message: ext.ProcessingRequest, headers: dict[str, str]) -> None:
        """The worker that served, as the proxy reports it (else the pick), and the
        decision as run there."""
        assert self.pick is not None and self.pick.job is not None
        endpoint = protocol.served_endpoint(message, headers)
        self.served = self.services.worker_at(endpoint) if endpoint else None
        if self.served is None:
            self.served = self.pick.targets[0]
        job = self.pick.job
        job.decision = served(job.decision, self.served[0])

    def _response_body(self, message: ext.ProcessingRequest) -> ext.ProcessingResponse:
        pick = self.pick
        if pick is not None and pick.job is not None:
            # no response headers (SKIPped): the attributes say; without them the status
            # is unknown, and an unknown status counts against no worker
            if self.served is None and (status := protocol.response_code(message)):
                self.status = status
                self._served(message, {})
            body = message.response_body
            self.body_seen = True
            self.reader.feed(body.body)
            if self.reader.tokens_seen:
                pick.timer.token()
            if body.end_of_stream:
                self.reader.finish()
                self._finish()
        if self.duplex_response:
            body = message.response_body
            return protocol.streamed("response_body", body.body, body.end_of_stream)
        return protocol.go_on("response_body")

    def _finish(self) -> None:
        """Record the request once, release what it held (also from `close`)."""
        if self.closed:
            return
        self.closed = True
        pick = self.pick
        if pick is None or pick.job is None:
            return
        now = time.monotonic()
        primary = pick.targets[0][1]
        primary.outstanding -= 1
        if pick.ticket is not None:
            self.services.admission.leave(pick.ticket)
        served = self.served
        if served is not None and served[1] is not primary:
            primary.breaker.failure(now)  # Envoy went past it: refused or failed
        # a body never sent to the picker (response_body_mode NONE, GAIE's default) is a
        # success it cannot measure: counted, not learned from (no tokens seen)
        ok = self.status == 200 and (not self.body_seen or self.reader.done
                                     or self.reader.usage.completion_tokens > 0)
        if served is not None:
            if self.status >= 500 or self.status == 0:
                served[1].breaker.failure(now)
            else:
                served[1].served(now)
        job = pick.job
        outcome = Outcome(job.request, job.profile, job.tenant, job.decision, pick.timer,
                          load=pick.load, workers=pick.workers, usage=self.reader.usage,
                          spec=self.reader.spec, ok=ok,
                          finish_reason=self.reader.finish_reason)
        if not ok:
            pick.trace.set("http.response.status_code", self.status or 502)
        self.services.reporter.record(outcome, pick.trace)

    def close(self) -> None:
        """The stream ended (the client left, Envoy gave up, or the response is done).
        A picking stream whose response an observer reads leaves the end to the
        observer; if none has come it waits `OBSERVER_WAIT_S` for one."""
        if self.observed and self.key is not None and not self.closed:
            if not self.watched and self.wait is None:
                self.wait = asyncio.get_running_loop().call_later(OBSERVER_WAIT_S,
                                                                  self._unobserved)
            return
        self.end()

    def _unobserved(self) -> None:
        if self.key is not None and self.services.exchanges.pop(self.key, None) is self:
            log.warning("no observer stream came for a request within %g s: recorded "
                        "without its response", OBSERVER_WAIT_S)
            self.end()

    def watch(self) -> None:
        """The observer's stream has come; from now on it ends the exchange."""
        self.watched = True
        if self.wait is not None:
            self.wait.cancel()

    def end(self) -> None:
        try:
            self._finish()
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the stream hanging
            internal_error(exc, "picker: recording a finished request")  # logs it


async def observe(services: PickerServices,
                  messages: AsyncIterator[ext.ProcessingRequest]) -> None:
    """An observer's stream (a second ext_proc filter in `observability_mode`: Envoy sends
    and goes on, nothing is answered): its request headers name the exchange the pick
    made (`protocol.EXCHANGE`), its response headers and body feed that exchange as a
    picking stream's would, and its end ends the exchange. A stream naming no live
    exchange (not a generation, or refused) is read to its end and ignored."""
    exchange: Exchange | None = None
    try:
        async for message in messages:
            kind = message.WhichOneof("request")
            if exchange is None:
                if kind == "request_headers":
                    key = next((h.raw_value.decode("latin-1") or h.value
                                for h in message.request_headers.headers.headers
                                if h.key == protocol.EXCHANGE), None)
                    exchange = services.exchanges.pop(key, None) if key else None
                    if exchange is not None:
                        exchange.watch()
                continue
            try:
                if kind == "response_headers":
                    exchange._response_headers(message)
                elif kind == "response_body":
                    exchange._response_body(message)
            except Exception as exc:  # noqa: BLE001 - a bug: logged, the request goes on
                internal_error(exc, "picker: reading an observed response")
    finally:
        if exchange is not None:
            exchange.end()


def no_endpoint() -> GatewayError:
    return NoHealthyWorker("no ready endpoint", code="no_healthy_worker")

