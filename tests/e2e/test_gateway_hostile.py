"""Hostile input through the real stack: `specroute gateway` (uvicorn, the fast routes,
the Starlette routes) in front of an SGLang-shaped stub worker, over real HTTP.

Every case must get a clear OpenAI-shaped 4xx (or a 200 where the request is legitimate),
on one keep-alive connection that stays usable: never a 500, a hang or a dropped
connection. The gateway's log must end with no traceback.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from conftest import free_port, short_id, start_process, stop_process, wait_http
from gateway_harness import start_stub

from gateway.config import hash_api_key
from gateway.tenants.auth import is_loopback

KEY = "sk-hostile"
ADMIN_KEY = "sk-admin"
EXPLAIN_KEY = "sk-explain-limited"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("hostile")
    stub, worker = start_stub(tmp, "stub", "--model", "m1")
    port = free_port()
    config = {"server": {"health_interval_s": 0.5, "admin_api_key_sha256": hash_api_key(ADMIN_KEY)},
              "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3,
                         "model": "m1", "workers": [worker],
                         "capabilities": {"per_request_k": True}}],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)],
                           "may_pin": True},
                          {"name": "explainer", "api_key_sha256": [hash_api_key(EXPLAIN_KEY)],
                           "rate_limit_rpm": 2}]}
    (tmp / "gw.yaml").write_text(yaml.safe_dump(config))
    proc = start_process(["-m", "specroute.cli", "gateway", "--config", str(tmp / "gw.yaml"),
                          "--port", str(port), "--policy", "first"], tmp / "gw.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", 30, proc)
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        for _ in range(100):  # the worker's first probe
            if httpx.get(url + "/ready", headers=admin, timeout=2).status_code == 200:
                break
        with httpx.Client(base_url=url, timeout=10,
                          headers={"Authorization": f"Bearer {KEY}"}) as client:
            yield {"url": url, "client": client, "log": tmp / "gw.log"}
    finally:
        stop_process(proc)
        stop_process(stub)


def post(gw: dict, raw: bytes, path: str = "/v1/completions", **headers: str
         ) -> httpx.Response:
    return gw["client"].post(path, content=raw,
                             headers={"content-type": "application/json", **headers})


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None,
                        param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


def completions(**fields: object) -> bytes:
    return orjson.dumps({"model": "m1", "prompt": "alpha beta", **fields})


NESTED = b"[" * 100_000 + b"]" * 100_000
MESSAGES_10K = orjson.dumps({"model": "m1", "messages": [
    {"role": "user", "content": "hi"}] * 10_000})


@pytest.mark.parametrize(("raw", "status", "code", "param"), [
    # JSON the parser refuses: nesting past its depth limit, invalid UTF-8, NaN and
    # Infinity (not JSON), a number past a double, a lone surrogate escape
    (NESTED, 400, "invalid_json", None),
    (b'{"model": "m1", "prompt": "\xff\xfe"}', 400, "invalid_json", None),
    (b'{"model": "m1", "prompt": "x", "temperature": NaN}', 400, "invalid_json", None),
    (b'{"model": "m1", "prompt": "x", "temperature": -Infinity}', 400, "invalid_json", None),
    (b'{"model": "m1", "prompt": "x", "max_tokens": 1e400}', 400, "invalid_json", None),
    (b'{"model": "m1", "prompt": "\\ud800"}', 400, "invalid_json", None),
    (b"", 400, "invalid_json", None),
    # numbers out of range or of the wrong type
    (completions(max_tokens=0), 400, "invalid_value", "max_tokens"),
    (completions(max_tokens=-5), 400, "invalid_value", "max_tokens"),
    (b'{"model": "m1", "prompt": "x", "max_tokens": 18446744073709551616}', 400,
     "invalid_value", "max_tokens"),  # past u64: orjson reads a float
    (b'{"model": "m1", "prompt": "x", "seed": 18446744073709551615}', 400,
     "invalid_value", "seed"),  # u64 max: past the worker's i64
    (completions(max_tokens=10**9), 400, None, None),  # beyond every pool's context
    (completions(temperature="0.5"), 400, "invalid_value", "temperature"),
    (completions(temperature=1e308), 400, "invalid_value", "temperature"),
    (completions(top_p=-0.0001), 400, "invalid_value", "top_p"),
    (completions(n=0), 400, "invalid_value", "n"),
    (completions(stream=1), 400, "invalid_value", "stream"),
    (completions(prompt=[1, -2, 3]), 400, "invalid_value", "prompt"),
    (completions(prompt=[2**40]), 400, "invalid_value", "prompt"),
    (completions(prompt={"text": "x"}), 400, "invalid_value", "prompt"),
    (orjson.dumps(["model", "m1"]), 400, "invalid_value", "body"),
    (orjson.dumps("m1"), 400, "invalid_value", "body"),
    # a 1 MB prompt of one token repeated: within the body limit, past every context
    (completions(prompt="a" * 1_000_000), 400, None, None),
    # past the body limit
    (completions(prompt="a" * 5_000_000), 413, "request_too_large", None),
], ids=short_id)
def test_hostile_bodies_get_clear_4xx(gateway: dict, raw: bytes, status: int,
                                      code: str | None, param: str | None) -> None:
    assert_openai_error(post(gateway, raw), status, code, param)


CHAT = {"model": "m1", "messages": [{"role": "user", "content": "alpha beta"}]}
NATIVE = {"text": "alpha beta"}


@pytest.mark.parametrize(("path", "body", "param"), [
    # extension fields the adapters read: a wrong type was a TypeError in the adapter (500)
    ("/v1/completions", {"custom_params": "x"}, "custom_params"),
    ("/v1/completions", {"custom_params": [1]}, "custom_params"),
    ("/v1/chat/completions", {**CHAT, "custom_params": "x"}, "custom_params"),
    ("/v1/chat/completions", {**CHAT, "custom_params": 3}, "custom_params"),
    ("/generate", {**NATIVE, "sampling_params": {"custom_params": "x"}},
     "sampling_params.custom_params"),
    ("/v1/completions", {"json_schema": 5}, "json_schema"),
    ("/v1/completions", {"regex": ["a"]}, "regex"),
    ("/v1/completions", {"ebnf": {}}, "ebnf"),
    ("/v1/completions", {"top_k": "3"}, "top_k"),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": 5}, "tool_choice"),
    # found by the production-path fuzzer: unhashable values where a name belongs
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": ["user"], "content": "x"}]},
     "messages[0].role"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": {"a": 1}}},
     "response_format"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": ["x"]}]}]}, "messages[0].content"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, "tools[0].function"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "web", "function": {"name": "f"}}]},
     "tools[0].type"),
    # what SGLang and the embedded worker refuse, refused here with the field named
    ("/v1/completions", {"top_p": 0}, "top_p"),
    ("/generate", {**NATIVE, "sampling_params": {"top_p": 0}}, "sampling_params.top_p"),
    ("/v1/completions", {"regex": "a", "ebnf": "b"}, "ebnf"),
    ("/generate", {**NATIVE, "sampling_params": {"regex": "a", "json_schema": "{}"}},
     "sampling_params.regex"),
    ("/v1/chat/completions", {**CHAT, "regex": "a", "response_format": {"type": "text"}},
     "regex"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"function": {"name": "f",
                                                              "parameters": []}}]},
     "tools[0].function.parameters"),
    # SGLang's own fields, with the bounds /openapi.json states
    ("/generate", {**NATIVE, "sampling_params": {"top_p": 2}}, "sampling_params.top_p"),
    ("/generate", {**NATIVE, "sampling_params": {"temperature": -1}},
     "sampling_params.temperature"),
    ("/generate", {**NATIVE, "sampling_params": {"max_new_tokens": -1}},
     "sampling_params.max_new_tokens"),
    ("/generate", {**NATIVE, "sampling_params": {"stop": 5}}, "sampling_params.stop"),
    ("/generate", {**NATIVE, "sampling_params": {"json_schema": 5}},
     "sampling_params.json_schema"),
    ("/generate", {**NATIVE, "rid": 5}, "rid"),
])
def test_wrong_typed_extension_fields_are_400_naming_the_field(
        gateway: dict, path: str, body: dict, param: str) -> None:
    if path == "/v1/completions":
        body = {"model": "m1", "prompt": "alpha beta", **body}
    assert_openai_error(post(gateway, orjson.dumps(body), path), 400, "invalid_value", param)


def test_hostile_chat_bodies(gateway: dict) -> None:
    error = assert_openai_error(post(gateway, MESSAGES_10K, "/v1/chat/completions"), 400)
    assert "max_context" in error["message"]
    for messages, param in (("hi", "messages"), ([], "messages"), ([1], "messages[0]"),
                            ([{"role": "wizard", "content": "x"}], "messages[0].role"),
                            ([{"role": "user", "content": 5}], "messages[0].content")):
        raw = orjson.dumps({"model": "m1", "messages": messages})
        assert_openai_error(post(gateway, raw, "/v1/chat/completions"), 400,
                            "invalid_value", param)


def test_legitimate_oddities_are_served(gateway: dict) -> None:
    """A duplicate key means its last value (orjson, like Python's json), and the worker
    gets the body the gateway validated, so the two can never read different values;
    nesting below the parser's limit is data. An unknown field is a 400 naming it
    (tests/e2e/test_gateway_forwarding.py)."""
    deep = {"model": "m1", "messages": [{"role": "user", "content": "alpha beta"}],
            "custom_params": {"x": [[[[[[[[[[1]]]]]]]]]]}}
    assert post(gateway, orjson.dumps(deep), "/v1/chat/completions").status_code == 200
    unknown = {**deep, "frobnicate": {"x": 1}}
    assert_openai_error(post(gateway, orjson.dumps(unknown), "/v1/chat/completions"), 400,
                        "unknown_parameter", "frobnicate")
    duplicate = b'{"model": "m1", "prompt": "alpha", "max_tokens": 0, "max_tokens": 2}'
    response = post(gateway, duplicate)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 2
    escaped = orjson.dumps({"model": "m1", "prompt": "caf\u00e9 \U0001F600 \u2028"})
    assert post(gateway, escaped).status_code == 200


@pytest.mark.parametrize(("headers", "status", "code"), [
    ({"content-type": "text/plain"}, 415, "unsupported_media_type"),
    ({"content-type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
    ({"content-type": "application/json; charset=utf-8"}, 200, None),
    ({"content-type": "application/vnd.api+json"}, 200, None),
    ({"x-specroute-k": "\u00b2"}, 400, "invalid_value"),  # byte 0xB2: isdigit() but not int()
    ({"x-specroute-k": "99999999999999999999999999"}, 400, "invalid_value"),
    ({"x-specroute-k": "-1"}, 400, "invalid_value"),
    ({"x-specroute-k": "3"}, 200, None),  # the pool's own k
    ({"x-specroute-pool": "\u00ff\u00fe"}, 400, "unknown_pool"),
    ({"x-specroute-pool": "nope"}, 400, "unknown_pool"),
    ({"x-specroute-benchmark": "\u00e9"}, 200, None),
    ({"authorization": "Bearer \u00ff"}, 401, "invalid_api_key"),
    ({"authorization": "Basic " + KEY}, 401, "invalid_api_key"),
    ({"authorization": "bearer " + KEY}, 200, None),  # the scheme is case-insensitive
])
def test_hostile_headers(gateway: dict, headers: dict, status: int, code: str | None) -> None:
    encoded = {name: value.encode("latin-1") for name, value in headers.items()}
    encoded.setdefault("content-type", b"application/json")
    response = gateway["client"].post("/v1/completions", content=completions(max_tokens=2),
                                      headers=encoded)
    if status == 200:
        assert response.status_code == 200, response.text
    else:
        assert_openai_error(response, status, code)


def raw_exchange(url: str, head: bytes, body: bytes = b"") -> bytes:
    """One request as raw bytes (what httpx refuses to send); the whole answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(("header", "status"), [
    (b"x-specroute-k:  3\t", b"200"),  # optional whitespace around the value
    (b"x-specroute-k: \xd9\xa3", b"400"),  # Arabic-Indic three in UTF-8
    (b"authorization: Bearer \xc3\x28" + KEY.encode(), b"401"),  # invalid UTF-8
    (b"content-type: \xff/\xfe", b"415"),
    (b"content-length: 99999999999999999999999999999", b"400"),  # the HTTP parser's
])
def test_raw_hostile_headers(gateway: dict, header: bytes, status: bytes) -> None:
    body = completions(max_tokens=2)
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
            b"authorization: Bearer " + KEY.encode() + b"\r\n" + header)
    if not header.startswith(b"content-length"):
        head += b"\r\ncontent-length: " + str(len(body)).encode()
    if not header.startswith(b"content-type"):
        head += b"\r\ncontent-type: application/json"
    if header.startswith(b"authorization"):
        head = head.replace(b"authorization: Bearer " + KEY.encode() + b"\r\n", b"")
    answer = raw_exchange(gateway["url"], head, body)
    assert answer.split(b" ")[1] == status, answer[:300]
    if status != b"200" and b"content-length: 9999" not in head:
        assert b'"error"' in answer and b'"code"' in answer


def test_explain_counts_against_the_rate_limit(gateway: dict) -> None:
    body = completions()
    key = {"authorization": f"Bearer {EXPLAIN_KEY}"}
    assert post(gateway, body, "/v1/routing/explain", **key).status_code == 200
    assert post(gateway, body, "/v1/routing/explain", **key).status_code == 200
    assert_openai_error(post(gateway, body, "/v1/routing/explain", **key), 429,
                        "rate_limit_exceeded")


def test_admin_key_guards_metrics_and_ready_detail(gateway: dict) -> None:
    url, admin = gateway["url"], {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert_openai_error(httpx.get(url + "/metrics"), 401, "invalid_api_key")
    assert_openai_error(httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}),
                        401, "invalid_api_key")
    assert "specroute_requests_total" in httpx.get(url + "/metrics", headers=admin).text
    # with an admin key set, loopback alone no longer shows the detail
    assert httpx.get(url + "/ready").json() == {"ready": True, "models_ready": {"m1": True}}
    detail = httpx.get(url + "/ready", headers=admin).json()
    assert detail["pools"]["eagle"]["worker_states"][0]["url"].startswith("http://127.0.0.1")
    # SGLang's /server_info shape: per-worker states, their addresses for an admin only
    for path in ("/server_info", "/get_server_info"):
        states = httpx.get(url + path).json()["internal_states"]
        assert len(states) == 2 and not any("worker" in s for s in states), states
        states = httpx.get(url + path, headers=admin).json()["internal_states"]
        assert states[1]["worker"].startswith("http://127.0.0.1") and states[1]["pool"] == "eagle"


def test_wrong_routes_and_methods_are_openai_shaped(gateway: dict) -> None:
    client = gateway["client"]
    assert_openai_error(client.get("/v1/completions"), 405, "method_not_allowed")
    assert_openai_error(client.post("/v1/nothing", content=b"{}"), 404, "not_found")
    assert_openai_error(client.get("/v1/models/\u00e9t\u00e9"), 404, "model_not_found")


def test_connection_survives_and_log_is_clean(gateway: dict) -> None:
    """Runs last in this module: the same keep-alive connection still serves, and no
    case above left a traceback or a 500 in the gateway's log."""
    response = post(gateway, completions(max_tokens=2))
    assert response.status_code == 200
    log = Path(gateway["log"]).read_text()
    assert "Traceback" not in log and "internal error" not in log


@pytest.mark.parametrize(("server", "loopback"), [
    (("127.0.0.1", 8000), True), (("::1", 8000), True), (("127.3.4.5", 1), True),
    (("10.0.0.5", 8000), False), (("0.0.0.0", 8000), False), (("/tmp/gw.sock", None), False),
    (None, False)])
def test_loopback_is_read_from_the_connection(server: tuple | None, loopback: bool) -> None:
    """Without an admin key, `/ready`'s detail goes to loopback connections only."""
    assert is_loopback({"type": "http", "server": server}) is loopback
