"""Bounded generation through the real gateway and stub workers: every worker call has a
token budget, a non-streamed request that was already generating when the read timeout
hit is not started over on another worker, and no non-streamed request outlives
`server.total_timeout_s`, failover included.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_harness import gateway_over, start_stubs, stats

from gateway.config import hash_api_key

KEY, CAPPED = "sk-bounded", "sk-bounded-capped"
TIMEOUTS = {"connect_timeout_s": 1.0, "read_timeout_s": 2.0, "total_timeout_s": 3.0,
            "first_token_timeout_s": 2.0, "max_attempts": 3, "breaker_failures": 1000,
            "health_interval_s": 60.0, "default_max_tokens": 64}
SLACK_S = 1.5
CONTEXT = 300


def pool(name: str, workers: list[str]) -> dict:
    return {"name": name, "engine": "sglang", "method": "plain", "k": 0, "model": "m",
            "workers": workers, "capabilities": {"max_context": CONTEXT, "tools": True}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("bounded")
    fast = ["--model", "m", "--method", "plain", "--k", "0"]
    slow = [*fast, "--stall", "30"]
    procs, urls = start_stubs(tmp, {"fast": fast, "slow1": slow, "slow2": slow,
                                    "hung1": fast, "hung2": fast, "hung3": fast})
    config = {"server": TIMEOUTS,
              "pools": [pool("fast", [urls["fast"]]),
                        pool("slow", [urls["slow1"], urls["slow2"]]),
                        pool("hung", [urls["hung1"], urls["hung2"], urls["hung3"]])],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)],
                           "may_pin": True},
                          {"name": "capped", "api_key_sha256": [hash_api_key(CAPPED)],
                           "may_pin": True, "max_tokens": 40}]}
    with gateway_over(tmp, config, procs) as url:
        yield {"url": url, "urls": urls, "procs": procs, "log": tmp / "gw.log"}


def post(stack: dict, body: dict, pool_name: str, key: str = KEY,
         path: str = "/v1/chat/completions") -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = httpx.post(stack["url"] + path, json={"model": "m", **body}, timeout=30,
                          headers={"Authorization": f"Bearer {key}",
                                   "x-specroute-pool": pool_name})
    return response, time.monotonic() - start


def chat(text: str, **fields: object) -> dict:
    return {"messages": [{"role": "user", "content": text}], **fields}


def sent_budget(stack: dict) -> int | None:
    return stats(stack["urls"]["fast"])["last_max_tokens"]


def test_a_request_without_max_tokens_gets_a_bounded_budget(stack: dict) -> None:
    """server.default_max_tokens (64 here); less when the pool's context has less room
    (half of 300 tokens less the prompt estimate, tools included); the tenant's cap;
    completions OpenAI's 16; a client's own max_tokens untouched."""
    assert post(stack, chat("alpha beta"), "fast")[0].status_code == 200
    assert sent_budget(stack) == 64
    long_prompt = " ".join(["word"] * 200)  # 999 bytes: ~250 tokens + 4
    assert post(stack, chat(long_prompt), "fast")[0].status_code == 200
    assert sent_budget(stack) == (CONTEXT - 250 - 4) // 2
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}}]
    assert post(stack, chat(long_prompt, tools=tools), "fast")[0].status_code == 200
    assert 1 <= sent_budget(stack) < (CONTEXT - 250 - 4) // 2  # type: ignore[operator]
    assert post(stack, chat("alpha beta"), "fast", CAPPED)[0].status_code == 200
    assert sent_budget(stack) == 40
    assert post(stack, {"prompt": "alpha beta"}, "fast",
                path="/v1/completions")[0].status_code == 200
    assert sent_budget(stack) == 16
    assert post(stack, chat("alpha beta", max_tokens=7), "fast")[0].status_code == 200
    assert sent_budget(stack) == 7


def test_a_request_already_generating_is_not_retried_from_scratch(stack: dict) -> None:
    """Both workers of the pool take 30 s; the first one still answers /health, so after
    its read timeout the client gets a 504 at once and the second never sees it."""
    slow = [stack["urls"]["slow1"], stack["urls"]["slow2"]]
    before = sum(stats(url)["generate_calls"] for url in slow)
    response, took = post(stack, {"prompt": "alpha", "max_tokens": 4}, "slow",
                          path="/v1/completions")
    assert response.status_code == 504, response.text
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout" and "still generating" in error["message"]
    assert took < TIMEOUTS["read_timeout_s"] + SLACK_S
    assert sum(stats(url)["generate_calls"] for url in slow) - before == 1


def test_no_request_outlives_the_total_timeout(stack: dict) -> None:
    """Three hung workers (SIGSTOPped: dead, so each read timeout fails over): the client
    gets a 504 at total_timeout_s, not after three read timeouts."""
    for name in ("hung1", "hung2", "hung3"):
        stack["procs"][name].send_signal(signal.SIGSTOP)
    try:
        response, took = post(stack, {"prompt": "alpha", "max_tokens": 4}, "hung",
                              path="/v1/completions")
    finally:
        for name in ("hung1", "hung2", "hung3"):
            stack["procs"][name].send_signal(signal.SIGCONT)
    assert response.status_code == 504, response.text
    assert response.json()["error"]["code"] == "upstream_timeout"
    assert TIMEOUTS["total_timeout_s"] - 0.2 < took < TIMEOUTS["total_timeout_s"] + SLACK_S
    assert "Traceback" not in stack["log"].read_text()
