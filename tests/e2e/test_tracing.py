"""OpenTelemetry end to end: the gateway and a real embedded worker (tiny model) export
spans over OTLP/HTTP to a real receiver on 127.0.0.1, configured only by the standard
OTEL_* variables; one trace id runs from the gateway's server span through its upstream
call into the worker's prefill and decode spans. No key and no prompt text on any span.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from conftest import free_port, start_process, stop_process, wait_http
from gateway_harness import start_gateway
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.config import hash_api_key

KEY = "sk-test-tracing"
PROMPT = "secret words the spans must not carry"
TEXT = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the dog.\n"] * 20


class Receiver:
    """An OTLP/HTTP trace receiver: decodes each export request into plain span dicts."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.raw: list[bytes] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.take(self.path, self.headers.get("content-type"), body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def take(self, path: str, content_type: str | None, body: bytes) -> None:
        assert path == "/v1/traces" and content_type == "application/x-protobuf"
        self.raw.append(body)
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            service = next(a.value.string_value for a in resource.resource.attributes
                           if a.key == "service.name")
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append({
                        "service": service, "name": span.name,
                        "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                        "parent": span.parent_span_id.hex(),
                        "attributes": {a.key: _value(a.value) for a in span.attributes}})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: object) -> object:
    kind = value.WhichOneof("value")  # type: ignore[attr-defined]
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]  # type: ignore[attr-defined]
    return getattr(value, kind) if kind else None


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    from tiny_models import tiny_model_dir

    tmp = tiny_model_dir(tmp_path_factory.mktemp("traced"), TEXT, 300, 512)
    receiver = Receiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    port = free_port()
    worker = start_process(["-m", "specroute.cli", "worker", "--method", "plain", "--port",
                            str(port), "--model", str(tmp), "--threads", "1"],
                           tmp / "worker.log", env={**env, "OTEL_SERVICE_NAME": "test-worker"})
    procs = [worker]
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 60, worker)
        gateway_proc, gateway = start_gateway(tmp, {
            "pools": [{"name": "e", "engine": "embedded", "model": "tiny", "workers": [url],
                       "capabilities": {"max_context": 512}}],
            "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]}]},
            env=env)
        procs.append(gateway_proc)
        yield {"gateway": gateway, "receiver": receiver}
    finally:
        for proc in reversed(procs):
            stop_process(proc)
        receiver.close()


def wait_for(receiver: Receiver, trace: str, names: set[str]) -> list[dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        spans = [s for s in receiver.spans if s["trace"] == trace]
        if names <= {s["name"] for s in spans}:
            return spans
        time.sleep(0.1)
    raise AssertionError(f"spans missing: {names - {s['name'] for s in spans}}")


@pytest.mark.parametrize("stream", [False, True])
def test_one_trace_across_gateway_and_worker(traced: dict, stream: bool) -> None:
    client = openai.OpenAI(base_url=traced["gateway"] + "/v1", api_key=KEY, max_retries=0)
    receiver: Receiver = traced["receiver"]
    before = len(receiver.spans)
    created = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=6,
        temperature=0, stream=stream)
    if stream:
        list(created)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        roots = [s for s in receiver.spans[before:] if s["name"] == "chat tiny"]
        if roots:
            break
        time.sleep(0.1)
    (root,) = roots
    spans = wait_for(receiver, root["trace"], {"authenticate", "classify", "decide",
                                               "queue wait", "upstream call", "worker chat",
                                               "prefill", "decode"})
    by_name = {s["name"]: s for s in spans}
    assert root["service"] == "specroute-gateway" and root["parent"] == ""
    for child in ("authenticate", "classify", "decide", "queue wait", "upstream call"):
        assert by_name[child]["parent"] == root["id"], child
    worker = by_name["worker chat"]
    assert worker["service"] == "test-worker"  # OTEL_SERVICE_NAME
    assert worker["parent"] == by_name["upstream call"]["id"]  # traceparent carried it on
    assert by_name["prefill"]["parent"] == worker["id"]
    assert by_name["decode"]["attributes"]["gen_ai.usage.output_tokens"] >= 1
    attributes = root["attributes"]
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.request.max_tokens"] == 6
    assert attributes["gen_ai.request.temperature"] == 0.0
    assert attributes["gen_ai.usage.output_tokens"] >= 1
    assert attributes["gen_ai.usage.input_tokens"] >= 1
    assert attributes["gen_ai.response.finish_reasons"] in (["length"], ["stop"])
    assert attributes["specroute.tenant"] == "acme"
    assert attributes["specroute.pool"] == "e" and attributes["specroute.method"] == "plain"
    for name in ("specroute.task", "specroute.k", "specroute.accept_length",
                 "specroute.verify_steps", "specroute.ttft_ms", "specroute.slo_met",
                 "specroute.decision_reason", "specroute.queued_ms"):
        assert name in attributes, name
    exported = b"".join(receiver.raw)
    assert KEY.encode() not in exported and b"secret words" not in exported
    assert hash_api_key(KEY).encode() not in exported


def test_a_refused_request_is_traced_without_its_key(traced: dict) -> None:
    receiver: Receiver = traced["receiver"]
    before = len(receiver.spans)
    client = openai.OpenAI(base_url=traced["gateway"] + "/v1", api_key="sk-wrong-key",
                           max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user",
                                                                "content": PROMPT}])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
            s["name"] == "chat" and s["attributes"].get("http.response.status_code") == 401
            for s in receiver.spans[before:]):
        time.sleep(0.1)
    (span,) = [s for s in receiver.spans[before:] if s["name"] == "chat"]
    assert span["attributes"]["error.type"] == "invalid_api_key"
    assert b"sk-wrong-key" not in b"".join(receiver.raw)
