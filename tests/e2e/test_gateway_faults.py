"""Timeouts and internal faults with real processes: the gateway (run the way `serve`
runs it: `uvicorn_options`, the head deadline) in front of `tests/stall_stub.py`, a real
aiohttp worker that stalls on cue, and clients on raw sockets that trickle their bytes.

Every case is bounded: the gateway answers (408, 504, an SSE error event, a 500 with a
request id) or closes the connection within its configured timeouts, never hangs.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from conftest import stop_process, wait_http
from gateway_harness import start_gateway, start_stub

from gateway.config import hash_api_key

KEY = "sk-fault-SECRET-KEY"
PROMPT_SECRET = "PROMPT-SECRET-4711"
TIMEOUTS = {"header_timeout_s": 1.0, "body_timeout_s": 1.0, "first_token_timeout_s": 1.0,
            "read_timeout_s": 1.5, "total_timeout_s": 3.0}
SLACK_S = 4.0  # the shared 2-core box: scheduling, process start of nothing else

GATEWAY_MAIN = """
import logging
import sys
import uvicorn
from starlette.routing import Route
from gateway.http.app import create_app
from gateway.config import load_config
from dataclasses import replace
from gateway.classifier.minimal import minimal_profile
from policies.rules import first_healthy
from gateway.http.serve import uvicorn_options

def classify(request, tenant):
    return replace(minimal_profile(request, tenant), reasons=(str(request.prompt),))

def decide(profile, pools):
    if "BREAK_POLICY" in profile.reasons[0]:
        raise RuntimeError("policy broke on " + profile.reasons[0])
    return first_healthy(profile, pools)

async def broken(request):
    raise KeyError(request.headers.get("authorization"))

import gateway.upstream.adapters.openai as openai_adapter
read_deltas = openai_adapter.deltas_from_chunk

def deltas(chunk, chat):  # a stand-in for a bug in the adapter
    if chunk.get("bug"):
        raise RuntimeError("adapter bug on purpose")
    return read_deltas(chunk, chat)

openai_adapter.deltas_from_chunk = deltas

config = load_config(sys.argv[1])
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
app = create_app(config, decide=decide, classify=classify)
app.router.routes.append(Route("/broken", broken))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), **uvicorn_options(config.server))
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("faults")
    stub, worker = start_stub(tmp, "stall", script="tests/stall_stub.py")
    config = {"server": {**TIMEOUTS, "max_attempts": 1, "breaker_failures": 1000,
                         "health_interval_s": 0.5},
              "pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": [worker]}],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]}]}
    try:
        proc, url = start_gateway(tmp, config, name="gw", script=GATEWAY_MAIN)
    except BaseException:
        stop_process(stub)
        raise
    try:
        wait_http(url + "/ready", 10)
        with httpx.Client(base_url=url, timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"}) as client:
            yield {"url": url, "client": client, "log": tmp / "gw.log"}
    finally:
        stop_process(proc)
        stop_process(stub)


def completions(prompt: str, stream: bool = False) -> dict:
    return {"model": "m", "prompt": prompt, "stream": stream, "max_tokens": 4}


def chat(prompt: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": prompt}], "stream": True}


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def timed(call) -> tuple[httpx.Response, float]:  # noqa: ANN001 - any thunk
    start = time.monotonic()
    response = call()
    return response, time.monotonic() - start


# --- the upstream stalls ---------------------------------------------------------------

def test_worker_that_never_answers_is_504_after_read_timeout(gateway: dict) -> None:
    response, took = timed(lambda: gateway["client"].post(
        "/v1/completions", json=completions("STALL_HEAD")))
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert TIMEOUTS["read_timeout_s"] - 0.2 < took < TIMEOUTS["read_timeout_s"] + SLACK_S


def test_stream_without_a_first_token_is_504_after_first_token_timeout(gateway: dict) -> None:
    """The worker keeps the connection busy with SSE comments (no read timeout) but sends
    no token: the first-token deadline ends it before any byte reaches the client."""
    response, took = timed(lambda: gateway["client"].post(
        "/v1/completions", json=completions("STALL_FIRST", stream=True)))
    assert response.status_code == 504
    assert "first token" in response.json()["error"]["message"]
    assert took < TIMEOUTS["first_token_timeout_s"] + SLACK_S


def test_stream_stalling_after_a_token_ends_with_an_error_event(gateway: dict) -> None:
    response, took = timed(lambda: gateway["client"].post(
        "/v1/completions", json=completions("STALL_MID", stream=True)))
    assert response.status_code == 200
    events = sse_events(response.text)
    assert orjson.loads(events[0])["choices"][0]["text"] == "ok"
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_timeout"
    assert events[-1] == "[DONE]"
    assert took < TIMEOUTS["read_timeout_s"] + SLACK_S


def test_stream_trickling_forever_is_cut_at_the_total_timeout(gateway: dict) -> None:
    """A token every 0.3 s never trips the read timeout; the total one ends it, as a
    max_tokens cut ends (tests/e2e/test_gateway_stream_deadline.py: the openai client)."""
    response, took = timed(lambda: gateway["client"].post(
        "/v1/completions", json=completions("TRICKLE", stream=True)))
    events = sse_events(response.text)
    assert len(events) > 3
    assert orjson.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"
    assert TIMEOUTS["total_timeout_s"] - 0.2 < took < TIMEOUTS["total_timeout_s"] + SLACK_S


# --- the client is slow ----------------------------------------------------------------

def connect(gateway: dict) -> socket.socket:
    host, port = gateway["url"].removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUTS["body_timeout_s"]
                                    + SLACK_S + 5)


def read_all(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def test_body_sent_byte_by_byte_gets_408(gateway: dict) -> None:
    body = orjson.dumps(completions("alpha"))
    start = time.monotonic()
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\nauthorization: Bearer " + KEY.encode() +
                     b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n")
        sock.settimeout(0.25)
        answer = b""
        for byte in body:  # one byte every 0.25 s: the body would take ~10 s
            try:
                sock.sendall(bytes([byte]))
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
            if answer:
                break
        sock.settimeout(SLACK_S + 5)
        answer += read_all(sock)
    took = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert orjson.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    assert took < TIMEOUTS["body_timeout_s"] + SLACK_S


def test_silent_connection_is_closed_at_the_head_deadline(gateway: dict) -> None:
    start = time.monotonic()
    with connect(gateway) as sock:
        assert read_all(sock) == b""
    took = time.monotonic() - start
    assert TIMEOUTS["header_timeout_s"] - 0.2 < took < TIMEOUTS["header_timeout_s"] + SLACK_S


def test_head_sent_byte_by_byte_is_closed_at_the_head_deadline(gateway: dict) -> None:
    """Slow loris: each header byte arrives well within any idle timeout, the head as a
    whole never does."""
    start = time.monotonic()
    with connect(gateway) as sock:
        sock.settimeout(0.25)
        closed = False
        for byte in b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 100:
            try:
                sock.sendall(bytes([byte]))
                closed = sock.recv(65536) == b""
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                closed = True
            if closed:
                break
    took = time.monotonic() - start
    assert closed
    assert TIMEOUTS["header_timeout_s"] - 0.2 < took < TIMEOUTS["header_timeout_s"] + SLACK_S


# --- bugs: a 500 with a request id, the traceback logged without key or prompt ---------

def assert_internal_error(gateway: dict, response: httpx.Response) -> str:
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal_error" and error["type"] == "api_error"
    request_id = response.headers["x-request-id"]
    assert error["request_id"] == request_id and request_id in error["message"]
    log = Path(gateway["log"]).read_text()
    assert f"internal error, request id {request_id}" in log
    assert "Traceback (most recent call last)" in log
    assert KEY not in log and PROMPT_SECRET not in log
    return log


def test_bug_on_a_fast_route_is_a_500_with_request_id(gateway: dict) -> None:
    response = gateway["client"].post(
        "/v1/completions", json=completions(f"BREAK_POLICY {PROMPT_SECRET}"))
    log = assert_internal_error(gateway, response)
    assert "RuntimeError" in log
    assert gateway["client"].post("/v1/completions",
                                  json=completions("alpha")).status_code == 200


def test_bug_on_a_starlette_route_is_a_500_with_request_id(gateway: dict) -> None:
    log = assert_internal_error(gateway, gateway["client"].get("/broken"))
    assert "KeyError" in log
    assert log.count("Traceback") == log.count("internal error, request id")  # logged once


def test_malformed_event_before_the_first_token_is_a_502(gateway: dict) -> None:
    """A choice that is not an object: the adapter's protocol error, not a bug (with
    max_attempts 1 there is no other worker to retry)."""
    response = gateway["client"].post("/v1/chat/completions", json=chat("GARBAGE_FIRST"))
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_protocol_error"


def test_malformed_event_mid_stream_ends_with_an_error_event(gateway: dict) -> None:
    response = gateway["client"].post("/v1/chat/completions", json=chat("GARBAGE_MID"))
    events = sse_events(response.text)
    assert orjson.loads(events[0])["choices"][0]["delta"]["content"] == "ok"
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_protocol_error"
    assert events[-1] == "[DONE]"


def test_bug_before_the_first_token_is_a_500(gateway: dict) -> None:
    """A worker event the adapter trips over (a bug in the adapter, whatever the worker
    sent), before anything was sent to the client."""
    response = gateway["client"].post("/v1/chat/completions", json=chat("BUG_FIRST"))
    assert_internal_error(gateway, response)


def test_bug_mid_stream_ends_with_an_error_event(gateway: dict) -> None:
    response = gateway["client"].post("/v1/chat/completions", json=chat("BUG_MID"))
    assert response.status_code == 200
    events = sse_events(response.text)
    assert orjson.loads(events[0])["choices"][0]["delta"]["content"] == "ok"
    error = orjson.loads(events[-2])["error"]
    assert error["code"] == "internal_error" and error["request_id"] in Path(
        gateway["log"]).read_text()
    assert events[-1] == "[DONE]"
