"""The picker's ext_proc v3 message handling, over a real in-process gRPC server.

The pools' workers are addresses nothing listens on (no request is ever proxied here):
their health is set by hand, the rest is the picker as it runs: the gRPC servicer,
the exchange, the router with the real classifier and static rules, admission, tenants.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.config import hash_api_key, parse_config
from gateway.picker import protocol
from gateway.picker.reading import ResponseReader
from gateway.picker.runtime import PickerServices, build
from gateway.picker.server import make_server
from policies.types import RequestRecord

KEY = "sk-unit"
CODE = "Fix the bug in this function:\n```python\ndef add(a, b):\n    return a - b\n```"
CHAT = "How was your weekend? Tell me something nice about autumn."
JSON_ASK = "List three fruits with their colours. Respond in JSON only."
PLAIN, NGRAM_A, NGRAM_B, LOOK = ("10.9.0.1:8000", "10.9.0.2:8000", "10.9.0.3:8000",
                                 "10.9.0.4:8000")


class Capture:
    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, record: RequestRecord) -> None:
        self.records.append(record)


def make_services(**admission: object) -> PickerServices:
    raw = {"pools": [
        {"name": "plain", "engine": "sglang", "model": "m", "method": "plain", "k": 0,
         "workers": [f"http://{PLAIN}"]},
        {"name": "ngram", "engine": "sglang", "model": "m", "method": "ngram", "k": 4,
         "workers": [f"http://{NGRAM_A}", f"http://{NGRAM_B}"]},
        {"name": "lookahead", "engine": "embedded", "model": "m", "method": "lookahead",
         "k": 5, "workers": [f"http://{LOOK}"],
         "capabilities": {"per_request_k": True, "constrained_decoding": True}},
        {"name": "named", "engine": "sglang", "model": "m2", "method": "plain", "k": 0,
         "workers": ["http://worker.local:8000"]}],
        "admission": admission,
        "tenants": [{"name": "t", "api_key_sha256": [hash_api_key(KEY)]}]}
    services = build(parse_config(raw), policy="static")
    for pool in services.pools.values():
        for worker in pool.workers:
            worker.healthy = worker.probed = True
    services.started = True
    services.reporter.recorder = Capture()  # type: ignore[assignment]
    return services


@pytest.fixture
async def picker() -> AsyncIterator[tuple[PickerServices, grpc.aio.Channel]]:
    services = make_services()
    server, port = make_server(services, "127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield services, channel
    await channel.close()
    await server.stop(0)


def headers_message(path: str = "/v1/chat/completions", method: str = "POST",
                    end: bool = False, **extra: str) -> ext.ProcessingRequest:
    values = {":path": path, ":method": method, "authorization": f"Bearer {KEY}",
              "content-type": "application/json", **extra}
    return ext.ProcessingRequest(request_headers=ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode())
                                            for k, v in values.items()]),
        end_of_stream=end))


def body_message(body: dict | bytes, subset: list[str] | None = None) -> ext.ProcessingRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    message = ext.ProcessingRequest(request_body=ext.HttpBody(body=raw, end_of_stream=True))
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.fields[protocol.SUBSET].list_value.values.extend(
            struct_pb2.Value(string_value=e) for e in subset)
        message.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].CopyFrom(hint)
    return message


def chat(content: str, **kwargs: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **kwargs}


async def exchange(channel: grpc.aio.Channel, messages: list[ext.ProcessingRequest]
                   ) -> list[ext.ProcessingResponse]:
    """One ext_proc stream as Envoy runs it: a message, its answer, the next."""
    call = ext_grpc.ExternalProcessorStub(channel).Process()
    answers = []
    for message in messages:
        await call.write(message)
        answers.append(await call.read())
        if answers[-1].HasField("immediate_response"):
            break
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF  # the picker ends the stream when Envoy does
    return answers


def destination(answer: ext.ProcessingResponse) -> tuple[list[str], str]:
    """(endpoints in the header, in the envoy.lb metadata) of a pick."""
    common = answer.request_body.response if answer.HasField("request_body") \
        else answer.request_headers.response
    values = {h.header.key: h.header.raw_value.decode()
              for h in common.header_mutation.set_headers}
    metadata = answer.dynamic_metadata.fields[protocol.LB_NAMESPACE].struct_value
    return values[protocol.DESTINATION].split(","), \
        metadata.fields[protocol.DESTINATION].string_value


def error_of(answer: ext.ProcessingResponse) -> tuple[int, dict]:
    immediate = answer.immediate_response
    return immediate.status.code, orjson.loads(immediate.body)["error"]


async def test_code_goes_to_ngram_with_fallbacks_in_header_and_metadata(picker) -> None:
    _, channel = picker
    first, pick = await exchange(channel, [headers_message(), body_message(
        chat(CODE, temperature=0))])
    assert first.HasField("request_headers")  # the body decides
    endpoints, metadata = destination(pick)
    assert endpoints[0] in (NGRAM_A, NGRAM_B) and set(endpoints[:2]) == {NGRAM_A, NGRAM_B}
    assert len(endpoints) == 3 and metadata == ",".join(endpoints)  # never two values
    assert pick.request_body.response.clear_route_cache


async def test_the_pick_is_the_routers_decision(picker) -> None:
    services, channel = picker
    from gateway.schemas import parse_request

    for body in (chat(CODE, temperature=0), chat(CHAT, temperature=1.0),
                 chat(JSON_ASK, temperature=0)):
        request = parse_request(body, "chat")
        decision, pools = services.router.route(request, services.classify(request, "t"))
        _, pick = await exchange(channel, [headers_message(), body_message(body)])
        endpoints, _ = destination(pick)
        owner = services.worker_at(endpoints[0])
        assert owner is not None and owner[0].name == decision.pool == pools[0].name


async def test_per_request_k_and_stream_usage_are_written_into_the_body(picker) -> None:
    _, channel = picker
    _, pick = await exchange(channel, [headers_message(), body_message(
        chat(JSON_ASK, temperature=0, stream=True))])
    assert destination(pick)[0][0] == LOOK
    common = pick.request_body.response
    body = orjson.loads(common.body_mutation.body)
    assert body["custom_params"] == {"method": "lookahead", "num_speculative_tokens": 5}  # the gateway's, never the client's
    assert body["stream_options"] == {"include_usage": True}
    assert body["return_spec_tokens_details"] is True
    lengths = [h.header.raw_value for h in common.header_mutation.set_headers
               if h.header.key == "content-length"]
    assert lengths == [str(len(common.body_mutation.body)).encode()]


async def test_a_fixed_k_pool_gets_the_clients_body_unchanged_but_for_spec_details(
        picker) -> None:
    _, channel = picker
    _, pick = await exchange(channel, [headers_message(), body_message(
        chat(CODE, temperature=0, return_spec_tokens_details=True))])
    assert not pick.request_body.response.HasField("body_mutation")


@pytest.mark.parametrize(("headers", "body", "status", "code"), [
    ({"authorization": "Bearer sk-nope"}, chat(CHAT), 401, "invalid_api_key"),
    ({}, b"{not json", 400, "invalid_json"),
    ({"content-type": "text/plain"}, chat(CHAT), 415, "unsupported_media_type"),
    ({}, chat(CHAT, model="nope"), 404, "model_not_found"),
    ({}, chat(CHAT, temperature=9), 400, "invalid_value"),
    ({"x-specroute-pool": "ngram"}, chat(CHAT), 403, "pin_not_allowed"),
    ({protocol.SUBSET: NGRAM_B}, chat(CHAT), 403, "pin_not_allowed"),
])
async def test_refusals_are_openai_shaped_immediate_responses(
        picker, headers: dict, body: object, status: int, code: str) -> None:
    _, channel = picker
    answers = await exchange(channel, [headers_message(**headers), body_message(body)])
    got, error = error_of(answers[-1])
    assert (got, error["code"]) == (status, code)
    assert error["message"] and error["type"]
    assert answers[-1].immediate_response.details == f"specroute_{code}"


async def test_subset_hint_metadata_narrows_and_an_unknown_subset_is_503(picker) -> None:
    _, channel = picker
    _, pick = await exchange(channel, [headers_message(), body_message(
        chat(CODE, temperature=0), subset=[NGRAM_B, PLAIN])])
    assert destination(pick)[0] == [NGRAM_B, PLAIN]
    answers = await exchange(channel, [headers_message(), body_message(
        chat(CODE, temperature=0), subset=["10.1.1.1:1"])])
    status, error = error_of(answers[-1])
    assert (status, error["code"]) == (503, "no_healthy_worker")


async def test_no_ready_endpoint_is_503(picker) -> None:
    services, channel = picker
    for pool in services.pools.values():
        for worker in pool.workers:
            worker.healthy = False
    answers = await exchange(channel, [headers_message(), body_message(chat(CHAT))])
    status, error = error_of(answers[-1])
    assert (status, error["code"]) == (503, "no_healthy_worker")


async def test_a_get_is_placed_at_the_headers(picker) -> None:
    _, channel = picker
    [answer] = await exchange(channel, [headers_message("/v1/models", "GET", end=True)])
    endpoints, _ = destination(answer)
    assert endpoints[0] in (PLAIN, NGRAM_A, NGRAM_B, LOOK)
    assert "worker.local:8000" not in endpoints  # a host name cannot be named to Envoy


async def test_the_served_response_is_recorded_with_its_usage_and_counters(picker) -> None:
    services, channel = picker
    served = ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"text/event-stream"),
            base_pb2.HeaderValue(key=protocol.SERVED, raw_value=PLAIN.encode())])))
    chunks = [b'data: {"choices":[{"index":0,"delta":{"content":"Fix"}}]}\n\nda',
              b'ta: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],'
              b'"sglext":{"spec_tokens_details":{"spec_verify_ct":2,"spec_accept_length":2.0}}}'
              b'\n\ndata: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}\n\n',
              b"data: [DONE]\n\n"]
    bodies = [ext.ProcessingRequest(response_body=ext.HttpBody(
        body=c, end_of_stream=i == len(chunks) - 1)) for i, c in enumerate(chunks)]
    answers = await exchange(channel, [headers_message(), body_message(
        chat(CODE, temperature=0, stream=True)), served, *bodies])
    assert answers[1].HasField("request_body") and answers[2].HasField("response_headers")
    added = {h.header.key: h.header.raw_value.decode()
             for h in answers[2].response_headers.response.header_mutation.set_headers}
    # Envoy went past the ngram pods to plain: the record is plain's, reason says why
    assert added["x-specroute-pool"] == "plain"
    assert "failover to plain" in added["x-specroute-reason"]
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert (record.pool, record.method, record.k, record.ok) == ("plain", "plain", 0, True)
    assert (record.prompt_tokens, record.output_tokens, record.verify_steps) == (9, 4, 2)
    assert record.tenant == "t" and record.task == "edit"
    pool = services.pools["ngram"]
    assert sum(w.breaker.failures for w in pool.workers) == 1  # the skipped primary
    assert all(w.outstanding == 0 for p in services.pools.values() for w in p.workers)


async def test_a_stream_cut_before_the_response_releases_its_slot() -> None:
    services = make_services(max_inflight_per_worker=1)
    server, port = make_server(services, "127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await exchange(channel, [headers_message(), body_message(chat(CHAT, temperature=1.0))])
        await server.stop(1)
    assert services.admission.queues["plain"].running == 0
    assert services.pools["plain"].workers[0].outstanding == 0
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert not record.ok


async def test_health_services(picker) -> None:
    services, channel = picker
    stub = health_pb2_grpc.HealthStub(channel)

    async def status(name: str) -> int:
        return (await stub.Check(health_pb2.HealthCheckRequest(service=name))).status

    serving, not_serving = (health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.NOT_SERVING)
    assert [await status(s) for s in ("", "liveness", "readiness",
                                      "envoy.service.ext_proc.v3.ExternalProcessor")] \
        == [serving] * 4
    services.started = False
    assert (await status("liveness"), await status("readiness")) == (serving, not_serving)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await status("nope")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_reader_takes_events_split_across_chunks_and_whole_json() -> None:
    reader = ResponseReader(streaming=True)
    for part in (b'data: {"choices":[{"delta":{"content":"a"}}]}\n', b"\ndata: {\"us",
                 b'age":{"prompt_tokens":1,"completion_tokens":2}}\n\ndata: [DONE]\n\n'):
        reader.feed(part)
    reader.finish()
    assert (reader.tokens_seen, reader.done, reader.usage.completion_tokens) == (True, True, 2)
    whole = ResponseReader()
    whole.feed(b'{"meta_info": {"prompt_tokens": 3, "completion_tokens": 7, '
               b'"spec_verify_ct": 3, "finish_reason": {"type": "stop"}}, "text": "x"}')
    whole.finish()
    assert (whole.usage.completion_tokens, whole.spec.verify_steps, whole.finish_reason) \
        == (7, 3, "stop")
    broken = ResponseReader()
    broken.feed(b'{"usage": ')
    broken.finish()
    assert not broken.done and broken.usage.completion_tokens == 0


@pytest.mark.parametrize(("url", "endpoint"), [
    ("http://10.0.0.1:8000", "10.0.0.1:8000"), ("http://[fd00::1]:30000", "[fd00::1]:30000"),
    ("http://10.0.0.1", "10.0.0.1:80"), ("http://pod.ns.svc:8000", None),
    ("http://10.0.0.1:99999", None)])
def test_endpoint_of(url: str, endpoint: str | None) -> None:
    assert protocol.endpoint_of(url) == endpoint


async def test_a_post_to_another_route_is_placed_at_the_headers_and_its_body_passes(
        picker) -> None:
    _, channel = picker
    placed, passed = await exchange(channel, [headers_message("/v1/embeddings"),
                                              body_message({"input": "x", "model": "m"})])
    assert destination(placed)[0][0] in (PLAIN, NGRAM_A, NGRAM_B, LOOK)
    assert passed.HasField("request_body")
    assert not passed.request_body.response.HasField("body_mutation")


async def test_the_request_span_continues_the_callers_trace() -> None:
    """Envoy forwards `traceparent`: the picker's span for the request joins that trace
    and ends when the served response does (no key on it)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    services = make_services()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    services.tracer, services.provider = provider.get_tracer("test"), None
    services.reporter.tracer, services.reporter.provider = services.tracer, None
    server, port = make_server(services, "127.0.0.1:0")
    await server.start()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    done = ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status",
                                                                 raw_value=b"200")])))
    body = ext.ProcessingRequest(response_body=ext.HttpBody(
        body=b'{"choices":[{"message":{"content":"x"}}],"usage":{"completion_tokens":1}}',
        end_of_stream=True))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await exchange(channel, [
            headers_message(traceparent=f"00-{trace_id}-00f067aa0ba902b7-01"),
            body_message(chat(CHAT, temperature=1.0)), done, body])
        await server.stop(1)
    spans = exporter.get_finished_spans()
    assert {format(s.context.trace_id, "032x") for s in spans} == {trace_id}
    [span] = [s for s in spans if s.parent is not None and s.parent.is_remote]
    assert format(span.context.trace_id, "032x") == trace_id
    assert span.attributes["specroute.tenant"] == "t"
    assert KEY not in str(dict(span.attributes))
    provider.shutdown()


async def exchange_all(channel: grpc.aio.Channel, messages: list[ext.ProcessingRequest]
                       ) -> list[ext.ProcessingResponse]:
    """Envoy sending without waiting (full duplex): every message, then every answer."""
    call = ext_grpc.ExternalProcessorStub(channel).Process()
    for message in messages:
        await call.write(message)
    await call.done_writing()
    return [answer async for answer in call]


def first_of(mode: str, without_waiting: bool = False) -> ext.ProcessingRequest:
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

    message = headers_message()
    message.protocol_config.request_body_mode = ProcessingMode.BodySendMode.Value(mode)
    message.protocol_config.send_body_without_waiting_for_header_response = without_waiting
    return message


def chunks_of(body: dict, parts: int, end: bool = True) -> list[ext.ProcessingRequest]:
    raw = orjson.dumps(body)
    size = -(-len(raw) // parts)
    pieces = [raw[i:i + size] for i in range(0, len(raw), size)]
    return [ext.ProcessingRequest(request_body=ext.HttpBody(
        body=p, end_of_stream=end and i == len(pieces) - 1)) for i, p in enumerate(pieces)]


async def test_full_duplex_holds_the_headers_until_the_body_and_sends_the_body_back(
        picker) -> None:
    _, channel = picker
    body = chat(JSON_ASK, temperature=0)
    answers = await exchange_all(channel, [first_of("FULL_DUPLEX_STREAMED"),
                                           *chunks_of(body, 3)])
    assert [a.WhichOneof("response") for a in answers] == ["request_headers", "request_body"]
    endpoints, metadata = destination(answers[0])
    assert endpoints[0] == LOOK and metadata == ",".join(endpoints)
    sent = answers[1].request_body.response.body_mutation.streamed_response
    assert sent.end_of_stream
    assert orjson.loads(sent.body)["custom_params"] == {"method": "lookahead",
                                                          "num_speculative_tokens": 5}
    length = [h.header.raw_value for h in
              answers[0].request_headers.response.header_mutation.set_headers
              if h.header.key == "content-length"]
    assert length == [str(len(sent.body)).encode()]


async def test_full_duplex_trailers_end_the_body(picker) -> None:
    _, channel = picker
    trailers = ext.ProcessingRequest(request_trailers=ext.HttpTrailers())
    answers = await exchange_all(channel, [first_of("FULL_DUPLEX_STREAMED"),
                                           *chunks_of(chat(CODE, temperature=0), 2, end=False),
                                           trailers])
    assert [a.WhichOneof("response") for a in answers] == [
        "request_headers", "request_body", "request_trailers"]
    assert destination(answers[0])[0][0] in (NGRAM_A, NGRAM_B)
    sent = answers[1].request_body.response.body_mutation.streamed_response
    assert orjson.loads(sent.body)["messages"][0]["content"] == CODE


async def test_streamed_without_waiting_answers_every_chunk_after_the_headers(
        picker) -> None:
    _, channel = picker
    answers = await exchange_all(channel, [first_of("STREAMED", without_waiting=True),
                                           *chunks_of(chat(JSON_ASK, temperature=0), 3)])
    assert [a.WhichOneof("response") for a in answers] == [
        "request_headers", "request_body", "request_body", "request_body"]
    mutations = [a.request_body.response.body_mutation for a in answers[1:]]
    assert orjson.loads(mutations[0].body)["custom_params"]["num_speculative_tokens"] == 5
    assert [m.clear_body for m in mutations[1:]] == [True, True]


async def test_full_duplex_refusal_is_an_immediate_response(picker) -> None:
    _, channel = picker
    answers = await exchange_all(channel, [first_of("FULL_DUPLEX_STREAMED"),
                                           *chunks_of(chat(CHAT, model="nope"), 2)])
    [answer] = answers
    assert error_of(answer)[0] == 404


async def test_full_duplex_response_chunks_are_sent_back_as_they_pass(picker) -> None:
    from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode

    services, channel = picker
    first = headers_message()
    first.protocol_config.response_body_mode = \
        ProcessingMode.BodySendMode.FULL_DUPLEX_STREAMED
    served = ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"application/json")])))
    parts = [b'{"choices":[{"message":{"content":"x"}}],', b'"usage":{"completion_tokens":3}}']
    bodies = [ext.ProcessingRequest(response_body=ext.HttpBody(body=p, end_of_stream=i == 1))
              for i, p in enumerate(parts)]
    answers = await exchange(channel, [first, body_message(chat(CHAT, temperature=1.0)),
                                       served, *bodies])
    sent = [a.response_body.response.body_mutation.streamed_response for a in answers[3:]]
    assert [s.body for s in sent] == parts and [s.end_of_stream for s in sent] == [False, True]
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert record.ok and record.output_tokens == 3


async def test_a_body_over_the_cap_is_413_not_a_grpc_error(picker) -> None:
    _, channel = picker
    big = chat("word " * 1_000_000)  # ~5 MB: over the 4 MiB cap, past gRPC's default
    answers = await exchange(channel, [headers_message(), body_message(big)])
    status, error = error_of(answers[-1])
    assert (status, error["code"]) == (413, "request_too_large")


async def test_a_bug_is_a_500_with_a_request_id_and_no_message_leak(
        picker, caplog: pytest.LogCaptureFixture) -> None:
    services, channel = picker

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"secret prompt {CHAT}")

    services.router.assess = broken  # type: ignore[method-assign]
    answers = await exchange(channel, [headers_message(), body_message(chat(CHAT))])
    status, error = error_of(answers[-1])
    assert (status, error["code"]) == (500, "internal_error") and error["request_id"]
    assert "secret prompt" not in answers[-1].immediate_response.body.decode()
    assert error["request_id"] in caplog.text
    assert CHAT not in caplog.text  # the traceback's frames, never the message


def test_the_command_refuses_a_bad_config_and_an_open_exposure(
        tmp_path, capsys: pytest.CaptureFixture) -> None:
    import yaml

    from gateway.picker.server import run

    assert run(str(tmp_path / "missing.yaml"), None, 0) == 2
    open_config = tmp_path / "open.yaml"
    open_config.write_text(yaml.safe_dump({"pools": [
        {"name": "p", "engine": "sglang", "model": "m", "workers": [f"http://{PLAIN}"]}]}))
    assert run(str(open_config), "0.0.0.0", 0) == 2  # no tenants: loopback only
    err = capsys.readouterr().err
    assert "cannot read config" in err and "refusing to listen on 0.0.0.0" in err


async def test_without_the_response_body_a_200_counts_but_teaches_nothing() -> None:
    """GAIE's default filter sends no response body: the record is ok with no tokens,
    which the learned policy skips (`LearnedRoutingPolicy.record`)."""
    services = make_services()
    server, port = make_server(services, "127.0.0.1:0")
    await server.start()
    served = ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":status",
                                                                 raw_value=b"200")])))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await exchange(channel, [headers_message(), body_message(chat(CHAT, temperature=1.0)),
                                 served])
        await server.stop(1)
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert record.ok and record.output_tokens == 0


async def test_an_observer_stream_reads_the_response_off_the_requests_path(picker) -> None:
    """The response side through a second, observability-mode filter: the pick names
    its exchange in a request header and puts the x-specroute-* headers in `specroute`
    metadata; the observer's stream (nothing answered) carries that header, then the
    response; the request is recorded when the observer's stream ends."""
    services, channel = picker
    observed = (("x-specroute-response", "observed"),)
    call = ext_grpc.ExternalProcessorStub(channel).Process(metadata=observed)
    await call.write(headers_message())
    await call.read()
    await call.write(body_message(chat(CODE, temperature=0)))
    pick = await call.read()
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    common = pick.request_body.response
    added = {h.header.key: h.header.raw_value.decode()
             for h in common.header_mutation.set_headers}
    key = added[protocol.EXCHANGE]
    ours = pick.dynamic_metadata.fields[protocol.SPECROUTE_NAMESPACE].struct_value.fields
    assert ours["x-specroute-pool"].string_value == "ngram"
    assert services.exchanges.keys() == {key}
    assert services.reporter.recorder.records == []  # type: ignore[attr-defined]
    served = ext.ProcessingRequest(response_headers=ext.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200"),
            base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
            base_pb2.HeaderValue(key=protocol.SERVED, raw_value=NGRAM_B.encode())])))
    answer = orjson.dumps({"choices": [{"index": 0, "message": {"content": "ok"},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    observer = ext_grpc.ExternalProcessorStub(channel).Process(
        metadata=(("x-specroute-response", "observe"),))
    for message in (headers_message(**{protocol.EXCHANGE: key}), served,
                    ext.ProcessingRequest(response_body=ext.HttpBody(body=answer,
                                                                     end_of_stream=True))):
        await observer.write(message)
    await observer.done_writing()
    assert [a async for a in observer] == []  # send and go: no answers
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert (record.pool, record.ok, record.prompt_tokens, record.output_tokens) == (
        "ngram", True, 7, 3)
    assert services.exchanges == {}
    assert all(w.outstanding == 0 for p in services.pools.values() for w in p.workers)


async def test_an_observer_naming_no_exchange_is_ignored(picker) -> None:
    services, channel = picker
    observer = ext_grpc.ExternalProcessorStub(channel).Process(
        metadata=(("x-specroute-response", "observe"),))
    await observer.write(headers_message(**{protocol.EXCHANGE: "not-a-live-one"}))
    await observer.done_writing()
    assert [a async for a in observer] == []
    assert services.reporter.recorder.records == []  # type: ignore[attr-defined]


async def test_a_pick_whose_observer_never_comes_is_recorded_after_a_wait(
        picker, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from gateway.picker import exchange as module

    monkeypatch.setattr(module, "OBSERVER_WAIT_S", 0.05)
    services, channel = picker
    call = ext_grpc.ExternalProcessorStub(channel).Process(
        metadata=(("x-specroute-response", "observed"),))
    for message in (headers_message(), body_message(chat(CHAT, temperature=1.0))):
        await call.write(message)
        await call.read()
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    for _ in range(100):
        if services.reporter.recorder.records:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.02)
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert not record.ok and services.exchanges == {}
    assert services.pools["plain"].workers[0].outstanding == 0


async def test_health_watch_streams_each_change(picker) -> None:
    services, channel = picker
    stub = health_pb2_grpc.HealthStub(channel)
    Status = health_pb2.HealthCheckResponse  # noqa: N806
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="readiness"))
    assert (await watch.read()).status == Status.SERVING
    services.started = False  # as before the first health round
    assert (await watch.read()).status == Status.NOT_SERVING
    services.started = True
    assert (await watch.read()).status == Status.SERVING
    watch.cancel()
    unknown = stub.Watch(health_pb2.HealthCheckRequest(service="nope"))
    assert (await unknown.read()).status == Status.SERVICE_UNKNOWN
    unknown.cancel()
    live = stub.Watch(health_pb2.HealthCheckRequest(service="liveness"))
    assert (await live.read()).status == Status.SERVING
    live.cancel()


def attributes(code: int, served: str) -> struct_pb2.Struct:
    """What Envoy sends with the first response-side message for `response_attributes`."""
    values = struct_pb2.Struct()
    values.fields["response.code"].number_value = code
    values.fields["upstream.address"].string_value = served
    return values


@pytest.mark.parametrize(("code", "ok"), [(200, True), (503, False)])
async def test_a_body_only_response_takes_status_and_server_from_its_attributes(
        picker, code: int, ok: bool) -> None:
    """The response headers SKIPped (`response="body"`): the pick puts the x-specroute-*
    headers in `specroute` metadata for the route to set, and the first body chunk
    carries the status and the served endpoint as attributes; the record is the
    served pool's, and a failed status counts against its breaker."""
    services, channel = picker
    call = ext_grpc.ExternalProcessorStub(channel).Process(
        metadata=(("x-specroute-response", "body"),))
    answer = orjson.dumps({"choices": [{"index": 0, "message": {"content": "ok"},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    first = ext.ProcessingRequest(response_body=ext.HttpBody(body=answer))
    first.attributes[protocol.EXT_PROC_ATTRIBUTES].CopyFrom(attributes(code, NGRAM_B))
    last = ext.ProcessingRequest(response_body=ext.HttpBody(end_of_stream=True))
    answers = []
    for message in (headers_message(), body_message(chat(CODE, temperature=0)), first, last):
        await call.write(message)
        answers.append(await call.read())
    await call.done_writing()
    assert await call.read() == grpc.aio.EOF
    ours = answers[1].dynamic_metadata.fields[protocol.SPECROUTE_NAMESPACE].struct_value
    assert ours.fields["x-specroute-pool"].string_value == "ngram"
    assert all(a.HasField("response_body") for a in answers[2:])
    [record] = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert (record.pool, record.ok) == ("ngram", ok)
    assert (record.prompt_tokens, record.output_tokens) == (7, 3)
    [served] = [w for w in services.pools["ngram"].workers if w.url.endswith(NGRAM_B)]
    assert served.breaker.failures == (0 if ok else 1)
    assert all(w.outstanding == 0 for p in services.pools.values() for w in p.workers)


async def test_a_body_without_attributes_counts_against_no_worker(picker) -> None:
    """Response headers SKIPped but no `response_attributes` configured: the status is
    unknown, so the request is recorded as not ok and no breaker counts it (three such
    requests would otherwise take the pool's workers out)."""
    services, channel = picker
    for _ in range(3):
        call = ext_grpc.ExternalProcessorStub(channel).Process(
            metadata=(("x-specroute-response", "body"),))
        for message in (headers_message(), body_message(chat(CHAT, temperature=1.0)),
                        ext.ProcessingRequest(response_body=ext.HttpBody(
                            body=b'{"choices": []}', end_of_stream=True))):
            await call.write(message)
            await call.read()
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    records = services.reporter.recorder.records  # type: ignore[attr-defined]
    assert [(r.pool, r.ok) for r in records] == [("plain", False)] * 3
    assert all(w.breaker.failures == 0 and w.outstanding == 0
               for p in services.pools.values() for w in p.workers)


def test_the_response_code_attribute_is_read_as_number_or_text() -> None:
    message = ext.ProcessingRequest()
    assert protocol.response_code(message) == 0
    message.attributes[protocol.EXT_PROC_ATTRIBUTES].fields["response.code"].string_value = "429"
    assert protocol.response_code(message) == 429
