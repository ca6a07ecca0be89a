"""What reaches a worker, through the real gateway and stub SGLang workers over HTTP
(issue 43): only the fields the gateway checks (any other is a 400 naming it, and no
worker is asked), text content parts only, the tenant's `max_tokens` cap in the body the
worker gets (native `/generate` included), the gateway's own `rid`; and every POST route
wants `Content-Type: application/json` (a 415 without it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from gateway_harness import gateway_over, start_stubs, stats

from gateway.config import hash_api_key

KEY = "sk-forward"
CAP = 7


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("forwarding")
    procs, urls = start_stubs(tmp, {"s": ["--model", "m", "--method", "plain", "--k", "0"],
                                    "v": ["--model", "v", "--method", "plain", "--k", "0"]})
    config = {"pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": [urls["s"]]},
                        {"name": "vl", "engine": "vllm", "method": "plain", "k": 0,
                         "model": "v", "workers": [urls["v"]]}],
              "tenants": [{"name": "capped", "api_key_sha256": [hash_api_key(KEY)],
                           "max_tokens": CAP}]}
    with gateway_over(tmp, config, procs) as url:
        yield {"url": url, "workers": urls}


def post(stack: dict, path: str, body: dict | bytes,
         content_type: str | None = "application/json") -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(stack["url"] + path, content=raw, headers=headers, timeout=30)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "say hi"}]}
COMPLETION = {"model": "m", "prompt": "say hi"}
NATIVE = {"model": "m", "text": "say hi"}
UNKNOWN = [  # the fields, and one of each route's own kind
    ("/v1/chat/completions", {**CHAT, "return_hidden_states": True}, "return_hidden_states"),
    ("/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"x": 1}},
     "chat_template_kwargs"),
    ("/v1/completions", {**COMPLETION, "custom_logit_processor": "..."},
     "custom_logit_processor"),
    ("/v1/completions", {**COMPLETION, "echo": True}, "echo"),
    ("/generate", {**NATIVE, "return_hidden_states": True}, "return_hidden_states"),
    ("/generate", {**NATIVE, "custom_logit_processor": "..."}, "custom_logit_processor"),
    ("/generate", {**NATIVE, "sampling_params": {"min_p": 0.1}}, "sampling_params.min_p"),
    ("/generate", {**NATIVE, "lora_path": "/models/x"}, "lora_path"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "http://169.254.169.254/"}}]}]},
     "messages[0].content[1].type"),
]


@pytest.mark.parametrize(("path", "body", "param"), UNKNOWN)
def test_unknown_fields_are_a_400_naming_them(stack: dict, path: str, body: dict,
                                              param: str) -> None:
    before = stats(stack["workers"]["s"])["generate_calls"]
    response = post(stack, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        param, "unknown_parameter", "invalid_request_error")
    assert stats(stack["workers"]["s"])["generate_calls"] == before  # no worker asked


def test_the_worker_gets_known_fields_and_the_tenants_cap(stack: dict) -> None:
    response = post(stack, "/v1/chat/completions", {**CHAT, "top_k": 5, "seed": 3})
    assert response.status_code == 200, response.text
    sent = stats(stack["workers"]["s"])["last_body"]
    assert sent["max_tokens"] == CAP and sent["top_k"] == 5 and sent["seed"] == 3
    # vLLM's pool gets none of SGLang's own extras
    response = post(stack, "/v1/chat/completions",
                    {**CHAT, "model": "v", "custom_params": {"x": 1}, "top_k": 2,
                     "ignore_eos": True, "return_spec_tokens_details": True})
    assert response.status_code == 200, response.text
    sent = stats(stack["workers"]["v"])["last_body"]
    assert "custom_params" not in sent and "return_spec_tokens_details" not in sent
    assert sent["top_k"] == 2 and sent["ignore_eos"] is True and sent["max_tokens"] == CAP
    wrong = post(stack, "/v1/chat/completions", {**CHAT, "ignore_eos": "yes"})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "ignore_eos"


def test_native_generate_gets_the_cap_and_the_gateways_rid(stack: dict) -> None:
    """Before: a native body went to the worker as sent, with no `max_new_tokens` (the
    worker's own default, whatever the tenant's cap) and the client's `rid`."""
    response = post(stack, "/generate", {**NATIVE, "rid": "someone-elses",
                                         "sampling_params": {"temperature": 0}})
    assert response.status_code == 200, response.text
    sent = stats(stack["workers"]["s"])["last_body"]
    assert sent["sampling_params"]["max_new_tokens"] == CAP
    assert sent["rid"] != "someone-elses"
    over = post(stack, "/generate", {**NATIVE, "sampling_params": {"max_new_tokens": CAP + 1}})
    assert over.status_code == 400
    assert over.json()["error"]["param"] == "sampling_params.max_new_tokens"


POSTS = [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION),
         ("/generate", NATIVE), ("/v1/routing/explain", CHAT)]


@pytest.mark.parametrize(("path", "body"), POSTS)
@pytest.mark.parametrize("content_type", [None, "text/plain", "text/plain;charset=UTF-8",
                                          "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x"])
def test_every_post_wants_json(stack: dict, path: str, body: dict,
                               content_type: str | None) -> None:
    """What a web page's script may POST cross-site without a CORS preflight: a form
    type, text/plain, or no type at all (a Blob without one) is a 415."""
    before = stats(stack["workers"]["s"])["generate_calls"]
    response = post(stack, path, body, content_type)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert stats(stack["workers"]["s"])["generate_calls"] == before


@pytest.mark.parametrize(("path", "body"), POSTS)
def test_json_with_a_charset_is_served(stack: dict, path: str, body: dict) -> None:
    response = post(stack, path, body, "application/json; charset=utf-8")
    assert response.status_code == 200, response.text
