"""No client steers what the fleet runs or learns: the gateway, never the client, sets
method and k on the worker body, and the telemetry record says what the worker ran.

Real processes: an SGLang-shaped stub worker that reports the method and k it ran with
(`GET /stats`, read from `custom_params` the way the embedded worker reads them), the
gateway with the learned policy, tenants and keys, and a real Redis whose telemetry
stream (`specroute:telemetry`) holds the records the policy learns from.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis
from conftest import stop_process
from gateway_harness import start_gateway, start_stub, stats

from gateway.config import hash_api_key
from policies.keys import STREAM_KEY

KEY, PINNER = "sk-steer-plain", "sk-steer-pinner"
CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user",
                                                     "content": "alpha beta gamma"}]}
STEERING = {"method": "ngram", "num_speculative_tokens": 9}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("steer")
    stub, worker = start_stub(tmp, "worker", "--model", "m", "--method", "eagle", "--k", "3")
    config = {"redis_url": redis_server, "server": {"health_interval_s": 0.5},
              "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3,
                         "model": "m", "workers": [worker],
                         "capabilities": {"per_request_k": True}}],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]},
                          {"name": "bench", "api_key_sha256": [hash_api_key(PINNER)],
                           "may_pin": True}]}
    try:
        proc, url = start_gateway(tmp, config, policy="learned", name="gw")
    except BaseException:
        stop_process(stub)
        raise
    try:
        yield {"url": url, "worker": worker, "redis": redis_server, "log": tmp / "gw.log"}
    finally:
        stop_process(proc)
        stop_process(stub)


def post(stack: dict, path: str, body: dict, key: str = KEY, **headers: str
         ) -> httpx.Response:
    return httpx.post(stack["url"] + path, json=body, timeout=10,
                      headers={"Authorization": f"Bearer {key}", **headers})


def stream_length(stack: dict) -> int:
    client = redis.Redis.from_url(stack["redis"])
    try:
        return int(client.xlen(STREAM_KEY))
    finally:
        client.close()


def record_after(stack: dict, seen: int) -> dict:
    """The newest telemetry record once the stream holds more than the `seen` it held
    before the request (the store flushes off the request path)."""
    client = redis.Redis.from_url(stack["redis"])
    deadline = time.monotonic() + 10
    try:
        while client.xlen(STREAM_KEY) <= seen:
            assert time.monotonic() < deadline, "no new telemetry record"
            time.sleep(0.05)
        (_, fields), = client.xrevrange(STREAM_KEY, count=1)
        return orjson.loads(fields[b"r"])
    finally:
        client.close()


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "custom_params": {"method": "ngram"}},
     "custom_params.method"),
    ("/v1/chat/completions", {**CHAT, "custom_params": {"num_speculative_tokens": 9}},
     "custom_params.num_speculative_tokens"),
    ("/v1/completions", {"model": "m", "prompt": "alpha", "custom_params": STEERING},
     "custom_params.method"),
    ("/generate", {"text": "alpha", "sampling_params": {"custom_params": STEERING}},
     "sampling_params.custom_params.method"),
])
def test_a_client_method_or_k_is_refused_and_never_reaches_the_worker(
        stack: dict, path: str, body: dict, param: str) -> None:
    before = stats(stack["worker"])["generate_calls"]
    for key in (KEY, PINNER):  # may_pin pins with the headers, not the body
        response = post(stack, path, body, key)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["code"] == "unsupported_parameter"
        assert "x-specroute-pool" in error["message"]
    assert stats(stack["worker"])["generate_calls"] == before


def test_the_record_and_the_worker_say_what_the_gateway_decided(stack: dict) -> None:
    """Other custom_params keys pass; the worker runs the pool's method with the k the
    gateway decided, and the telemetry record holds exactly that. The pool takes k per
    request, so the policy may decide k 0 on it (no speculation pays: the decision and
    the record then name the method `plain`, the worker still runs its own at k 0)."""
    seen = stream_length(stack)
    response = post(stack, "/v1/chat/completions", {**CHAT, "custom_params": {"x": 1}})
    assert response.status_code == 200, response.text
    decided = response.json()["specroute"]
    assert decided["method"] == ("eagle" if decided["k"] else "plain"), decided
    ran = stats(stack["worker"])
    assert (ran["last_method"], ran["last_k"]) == ("eagle", decided["k"])
    record = record_after(stack, seen)
    assert (record["pool"], record["method"], record["k"]) == (
        "eagle", decided["method"], decided["k"])
    assert not record["pinned"]


def test_pinning_stays_behind_may_pin(stack: dict) -> None:
    refused = post(stack, "/v1/chat/completions", CHAT, KEY, **{"x-specroute-k": "5"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "pin_not_allowed"
    seen = stream_length(stack)
    pinned = post(stack, "/v1/chat/completions", CHAT, PINNER, **{"x-specroute-k": "5"})
    assert pinned.status_code == 200, pinned.text
    assert stats(stack["worker"])["last_k"] == 5
    record = record_after(stack, seen)
    assert record["k"] == 5 and record["pinned"]  # kept out of what the policy learns
    assert "Traceback" not in stack["log"].read_text()
