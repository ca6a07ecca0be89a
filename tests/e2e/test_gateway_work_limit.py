"""Bounded work per request through the real gateway and a stub SGLang worker: a request
whose `n × max_tokens × (1 + logprobs)` is past `server.max_request_work` is a 400 naming
the field to lower, on the OpenAI routes and on native `/generate` (whose `n` and logprob
fields are checked as the OpenAI routes check theirs), and never reaches a worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_harness import gateway_over, start_stubs, stats

from gateway.config import DEFAULT_SERVER, hash_api_key

KEY = "sk-work"
LIMIT = DEFAULT_SERVER.max_request_work


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("work")
    procs, urls = start_stubs(tmp, {"w": ["--model", "m", "--method", "plain", "--k", "0"]})
    config = {"pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": [urls["w"]]}],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]}]}
    with gateway_over(tmp, config, procs) as url:
        yield {"url": url, "worker": urls["w"]}


def post(stack: dict, path: str, body: dict) -> httpx.Response:
    return httpx.post(stack["url"] + path, json=body, timeout=30,
                      headers={"Authorization": f"Bearer {KEY}"})


CHAT = {"model": "m", "messages": [{"role": "user", "content": "say hi"}]}
REFUSED = [
    # the case: 16 x 8,000 x 21 = 2.7 M logprob entries
    ("/v1/chat/completions", {**CHAT, "n": 16, "max_tokens": 8000, "logprobs": True,
                              "top_logprobs": 20}, "n"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 20000, "logprobs": True,
                              "top_logprobs": 20}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": LIMIT + 1}, "max_tokens"),
    ("/v1/completions", {"model": "m", "prompt": "hi", "n": 16, "max_tokens": 4000,
                         "logprobs": 5}, "n"),
    ("/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 20,
                   "sampling_params": {"max_new_tokens": 20000}}, "top_logprobs_num"),
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": LIMIT + 1}},
     "sampling_params.max_new_tokens"),
]
INVALID = [  # native fields the OpenAI routes bound, bounded the same way
    ({"text": "hi", "sampling_params": {"n": 2}}, "sampling_params.n"),
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
    ({"text": "hi", "return_logprob": True, "token_ids_logprob": list(range(21))},
     "token_ids_logprob"),
    ({"text": "hi", "return_logprob": "yes"}, "return_logprob"),
]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED)
def test_work_past_the_limit_is_a_400_naming_the_field(stack: dict, path: str, body: dict,
                                                       param: str) -> None:
    before = stats(stack["worker"])["generate_calls"]
    response = post(stack, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "request_too_large")
    assert str(LIMIT) in error["message"]
    assert stats(stack["worker"])["generate_calls"] == before


@pytest.mark.parametrize(("body", "param"), INVALID)
def test_native_n_and_logprob_fields_are_checked(stack: dict, body: dict, param: str) -> None:
    response = post(stack, "/generate", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_work_within_the_limit_is_served(stack: dict) -> None:
    response = post(stack, "/v1/chat/completions", {**CHAT, "n": 16, "max_tokens": 100,
                                                    "logprobs": True, "top_logprobs": 20})
    assert response.status_code == 200, response.text
    response = post(stack, "/generate", {"text": "hi there", "return_logprob": True,
                                         "top_logprobs_num": 5,
                                         "sampling_params": {"max_new_tokens": 8}})
    assert response.status_code == 200, response.text
