"""`/v1/routing/explain`, class → pool routing with `static_rules`, and the pinning
headers, against a real gateway process and one real stub worker per method."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import stop_process
from gateway_harness import start_gateway, start_stubs, stats

from gateway.config import hash_api_key

KEY = "sk-routing"
AUTH = {"Authorization": f"Bearer {KEY}"}
CODE = ("Fix the bug in this function:\n```python\ndef add(a, b):\n    return a - b\n```")
JSON_ASK = "List three fruits with their colours. Respond in JSON only."
CHAT = "How was your weekend? Tell me something nice about autumn."
METHODS = {"plain": 0, "ngram": 4, "lookahead": 4, "eagle": 3}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("routing")
    procs: list = []
    try:
        started, urls = start_stubs(tmp, {method: ["--model", "m", "--method", method, "--k",
                                                   str(k)] for method, k in METHODS.items()})
        procs.extend(started.values())
        caps = {"lookahead": {"constrained_decoding": True, "per_request_k": True},
                "eagle": {"tools": True}}
        pools = [{"name": method, "engine": "sglang", "method": method, "k": k, "model": "m",
                  "workers": [urls[method]], "capabilities": caps.get(method, {})}
                 for method, k in METHODS.items()]
        pools.append({"name": "other", "engine": "sglang", "model": "m2",
                      "workers": [urls["plain"]]})
        config = {"pools": pools, "server": {"health_interval_s": 0.5},
                  "tenants": [{"name": "t", "api_key_sha256": [hash_api_key(KEY)],
                               "may_pin": True}]}
        proc, gateway = start_gateway(tmp, config, policy="static")
        procs.append(proc)
        yield {"gateway": gateway, "workers": urls, "log": tmp / "gateway.log"}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def chat(content: str, **kwargs: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **kwargs}


def calls(stack: dict) -> dict[str, int]:
    return {name: stats(url)["generate_calls"] for name, url in stack["workers"].items()}


def explain(stack: dict, body: dict, **headers: str) -> httpx.Response:
    return httpx.post(stack["gateway"] + "/v1/routing/explain", json=body,
                      headers={**AUTH, **headers}, timeout=5)


@pytest.mark.parametrize(("body", "task", "pool"), [
    (chat(CODE, temperature=0), "edit", "ngram"),
    (chat(JSON_ASK, temperature=0), "structured", "lookahead"),
    (chat(CHAT, temperature=0.2), "chat", "eagle"),
    (chat(CHAT, temperature=1.0), "chat", "plain"),
    ({"model": "m", "prompt": CODE, "temperature": 0}, "edit", "ngram"),
])
def test_explain_shows_profile_and_decision_without_generating(
        stack: dict, body: dict, task: str, pool: str) -> None:
    before = calls(stack)
    response = explain(stack, body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["endpoint"] == ("chat" if "messages" in body else "completions")
    assert answer["profile"]["task"] == task
    assert answer["profile"]["reasons"]  # the classifier says why
    assert answer["decision"]["pool"] == pool
    assert answer["decision"]["reason"].startswith("static rule")
    assert answer["order"][0] == pool and answer["order"][-1] == "plain" or pool == "plain"
    by_pool = {c["pool"]: c for c in answer["candidates"]}
    assert by_pool["other"] == {**by_pool["other"], "eligible": False,
                                "why_not": "serves model 'm2'"}
    assert all(by_pool[m]["eligible"] for m in METHODS)
    assert set(answer["predictions"]) == set(METHODS)  # each eligible pool on its own
    assert answer["predictions"][pool]["k"] == answer["decision"]["k"]
    assert calls(stack) == before  # nothing was generated


def test_explain_names_missing_capabilities(stack: dict) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    answer = explain(stack, chat(JSON_ASK, response_format=fmt)).json()
    assert answer["profile"]["needs_constrained"] is True
    by_pool = {c["pool"]: c for c in answer["candidates"]}
    assert by_pool["lookahead"]["eligible"] and answer["decision"]["pool"] == "lookahead"
    assert by_pool["eagle"]["why_not"] == "lacks constrained_decoding (response_format)"
    both = explain(stack, chat(JSON_ASK, response_format=fmt,
                               tools=[{"type": "function", "function": {"name": "f"}}]))
    assert both.status_code == 400
    assert both.json()["error"]["code"] == "unsupported_capability"
    assert "tools" in both.json()["error"]["message"]


@pytest.mark.parametrize(("body", "headers", "status", "code"), [
    (chat("hi", temperature=3), AUTH, 400, "invalid_value"),
    ({"model": "m"}, AUTH, 400, "invalid_value"),
    (chat("hi", model="nope"), AUTH, 404, "model_not_found"),
    (chat("hi"), {}, 401, "invalid_api_key"),
    (chat("hi"), {**AUTH, "x-specroute-pool": "nope"}, 400, "unknown_pool"),
])
def test_explain_errors_match_the_real_routes(stack: dict, body: dict, headers: dict,
                                              status: int, code: str) -> None:
    url = stack["gateway"]
    explained = httpx.post(url + "/v1/routing/explain", json=body, headers=headers)
    real = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)
    assert explained.status_code == real.status_code == status
    assert explained.json()["error"]["code"] == real.json()["error"]["code"] == code


@pytest.mark.parametrize(("body", "pool"), [
    (chat(CODE, temperature=0), "ngram"),
    (chat(JSON_ASK, temperature=0), "lookahead"),
    (chat(CHAT, temperature=0.2), "eagle"),
    ({"model": "m", "prompt": CHAT, "temperature": 1.2}, "plain"),
])
def test_requests_go_to_the_pool_of_their_class(stack: dict, body: dict, pool: str) -> None:
    before = calls(stack)
    response = httpx.post(stack["gateway"] + ("/v1/chat/completions" if "messages" in body
                                              else "/v1/completions"),
                          json=body, headers=AUTH, timeout=5)
    assert response.status_code == 200, response.text
    assert response.headers["x-specroute-pool"] == pool
    facts = response.json()["specroute"]
    assert facts["pool"] == pool and facts["reason"].startswith("static rule")
    assert response.headers["x-specroute-reason"] == facts["reason"]
    after = calls(stack)
    assert {m: after[m] - before[m] for m in METHODS} == {m: int(m == pool) for m in METHODS}


def test_pinned_pool_overrides_the_policy(stack: dict) -> None:
    response = httpx.post(stack["gateway"] + "/v1/chat/completions", headers={
        **AUTH, "x-specroute-pool": "plain"}, json=chat(CODE, temperature=0), timeout=5)
    assert response.status_code == 200
    assert response.headers["x-specroute-pool"] == "plain"
    assert response.json()["specroute"]["reason"] == "pinned by x-specroute-pool"
    fmt = {"type": "json_object"}
    refused = httpx.post(stack["gateway"] + "/v1/chat/completions", headers={
        **AUTH, "x-specroute-pool": "eagle"}, json=chat(JSON_ASK, response_format=fmt))
    assert refused.status_code == 400
    assert "constrained_decoding" in refused.json()["error"]["message"]
    assert refused.json()["error"]["param"] == "x-specroute-pool"


def test_pinned_k_reaches_per_request_k_pools_only(stack: dict) -> None:
    url = stack["gateway"]
    response = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": CHAT},
                          headers={**AUTH, "x-specroute-k": "7"}, timeout=5)
    assert response.status_code == 200, response.text
    assert response.headers["x-specroute-pool"] == "lookahead"  # the only per-request-k pool
    assert response.headers["x-specroute-k"] == "7"
    assert stats(stack["workers"]["lookahead"])["last_k"] == 7
    same = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": CHAT},
                      headers={**AUTH, "x-specroute-k": "4", "x-specroute-pool": "ngram"})
    assert same.status_code == 200 and same.headers["x-specroute-k"] == "4"
    for k, pool in (("9", "ngram"), ("abc", "ngram"), ("99", "lookahead")):
        bad = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x"},
                         headers={**AUTH, "x-specroute-k": k, "x-specroute-pool": pool})
        assert bad.status_code == 400 and bad.json()["error"]["param"] in (
            "x-specroute-k", "x-specroute-pool")


def test_non_ascii_digit_k_is_a_400_not_a_500(stack: dict) -> None:
    """'²' (byte 0xB2) passes str.isdigit() and then int() raised: a client-made 500."""
    for route in ("/v1/routing/explain", "/v1/chat/completions"):
        response = httpx.post(stack["gateway"] + route, json=chat("hi"),
                              headers={**AUTH, "x-specroute-k": b"\xb2"}, timeout=5)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("x-specroute-k", "invalid_value")


def test_gateway_log_is_clean(stack: dict) -> None:
    log = stack["log"].read_text()
    assert "Traceback" not in log and "request classifier unavailable" not in log
