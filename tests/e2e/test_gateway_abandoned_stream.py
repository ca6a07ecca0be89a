"""A stream the client abandons is still charged (issue 43), through the real gateway, a
stub SGLang worker that drips its chunks, and a real Redis holding the tenants' token
windows: the tokens generated before the client hung up are in the tenant's window, and
a tenant whose token limit they reach is refused its next request. Before, tokens were
counted only from the worker's final `usage`, which an abandoned stream never gets."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import wait_until
from gateway_harness import gateway_over, start_stubs

from gateway.config import hash_api_key
from gateway.tenants.limits import WINDOW_S
from policies.keys import limit_window_keys

WORDS = [f"w{i}" for i in range(40)]  # the stub echoes them, one token per word
READ = 3  # data events read before hanging up


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("abandoned")
    procs, urls = start_stubs(tmp, {"w": ["--model", "m", "--method", "plain", "--k", "0",
                                          "--drip", "0.2"]})
    tenants = [{"name": name, "api_key_sha256": [hash_api_key(f"sk-{name}")],
                "rate_limit_tpm": 30} for name in ("native", "chat", "openai")]
    config = {"redis_url": redis_server,
              "pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": [urls["w"]]}],
              "tenants": tenants}
    with gateway_over(tmp, config, procs) as url:
        yield {"url": url, "redis": redis.Redis.from_url(redis_server)}


def abandon(stack: dict, tenant: str, path: str, body: dict) -> None:
    """Stream `body`, read `READ` data events, hang up."""
    headers = {"Authorization": f"Bearer sk-{tenant}"}
    seen = 0
    with httpx.stream("POST", stack["url"] + path, json=body, headers=headers,
                      timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            seen += line.startswith("data: ")
            if seen == READ:
                break


def charged(stack: dict, tenant: str) -> int:
    window = int(time.time() // WINDOW_S)
    return sum(int(stack["redis"].get(limit_window_keys(tenant, w)[1]) or 0)
               for w in (window - 1, window))


@pytest.mark.parametrize(("tenant", "path", "body"), [
    # SGLang's /generate: the worker's own running count on every chunk
    ("native", "/generate", {"text": " ".join(WORDS), "stream": True,
                             "sampling_params": {"max_new_tokens": 40}}),
    ("openai", "/v1/completions", {"model": "m", "prompt": " ".join(WORDS), "stream": True,
                                   "max_tokens": 40}),
    # SGLang's OpenAI chat route: no count until the end, the tally's estimate
    ("chat", "/v1/chat/completions", {"model": "m", "stream": True, "max_tokens": 40,
                                      "messages": [{"role": "user",
                                                    "content": " ".join(WORDS)}]}),
])
def test_an_abandoned_stream_is_charged(stack: dict, tenant: str, path: str,
                                        body: dict) -> None:
    if time.time() % WINDOW_S > WINDOW_S - 10:  # keep the charge and the refusal in one window
        time.sleep(WINDOW_S - time.time() % WINDOW_S)
    abandon(stack, tenant, path, body)
    wait_until(lambda: charged(stack, tenant) > 0, 10, f"{tenant}'s tokens charged")
    tokens = charged(stack, tenant)
    # the prompt (40 words, ~40 tokens) and at least the tokens the client read, at most
    # the prompt's estimate and the whole answer
    assert len(WORDS) + READ - 1 <= tokens <= 4 * len(WORDS) + 2 * len(WORDS), tokens
    refused = httpx.post(stack["url"] + path, json={**body, "stream": False}, timeout=30,
                         headers={"Authorization": f"Bearer sk-{tenant}"})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "token_limit_exceeded"
