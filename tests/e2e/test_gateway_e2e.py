"""End to end: the official `openai` client → the real gateway process → stub workers.

Every service is a real process speaking HTTP on loopback: SGLang-shaped and
vLLM-shaped stub workers (tests/sglang_stub.py, tests/openai_stub.py) and
`python -m specroute.cli gateway --config F`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from conftest import free_ports, start_process, stop_process, wait_http, wait_serves, wait_until

from gateway.config import hash_api_key

KEY = "sk-test-acme"
LIMITED_KEY = "sk-test-limited"
PROMPT = "alpha beta gamma delta"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("gw")
    names = ("sgl", "vllm", "dead", "incr", "gw", "open")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    stubs = [
        ("sgl", ["tests/sglang_stub.py", "--model", "m1", "--method", "eagle", "--k", "3"]),
        ("vllm", ["tests/openai_stub.py", "--model", "m2", "--method", "eagle3", "--k", "4"]),
        ("dead", ["tests/sglang_stub.py", "--model", "m3", "--fail-after", "0"]),
        ("incr", ["tests/sglang_stub.py", "--model", "m4", "--incremental"]),
    ]
    procs = [start_process([*args, "--port", str(ports[name])], tmp / f"{name}.log")
             for name, args in stubs]
    url = {name: f"http://127.0.0.1:{ports[name]}" for name in ports}
    pools = [
        {"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3, "model": "m1",
         "workers": [url["sgl"]], "capabilities": {"constrained_decoding": True, "tools": True}},
        {"name": "vllm-eagle3", "engine": "vllm", "method": "eagle3", "k": 4, "model": "m2",
         "workers": [url["vllm"]]},
        {"name": "broken", "engine": "sglang", "method": "plain", "k": 0, "model": "m3",
         "workers": [url["dead"]]},
    ]
    secured = {"server": {"max_body_bytes": 65536, "read_timeout_s": 1.0,
                          "health_interval_s": 0.5, "loopback_admin": True},
               "pools": pools,
               "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]},
                           {"name": "limited", "api_key_sha256": [hash_api_key(LIMITED_KEY)],
                            "rate_limit_rpm": 2}]}
    open_cfg = {"pools": [pools[0], {"name": "incr", "engine": "embedded", "method": "eagle",
                                     "k": 3, "model": "m4", "workers": [url["incr"]]}]}
    for name, cfg in (("gw", secured), ("open", open_cfg)):
        (tmp / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        procs.append(start_process(["-m", "specroute.cli", "gateway", "--config",
                                    str(tmp / f"{name}.yaml"), "--port", str(ports[name]),
                                    "--policy", "first"],
                                   tmp / f"{name}.log"))
    try:
        for (name, args), proc in zip(stubs, procs, strict=False):
            wait_serves(url[name], args[args.index("--model") + 1], proc)
        for name in ("gw", "open"):
            wait_http(url[name] + "/health", 30, procs[-1 if name == "open" else -2])
        wait_http(url["open"] + "/ready", 10)
        yield {"url": url["gw"], "open": url["open"], "logs": tmp}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


@pytest.fixture(scope="module")
def client(stack: dict) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack["url"] + "/v1", api_key=KEY, max_retries=0,
                         timeout=10)


def chat(model: str = "m1", content: str = PROMPT, **kwargs) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}], **kwargs}


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["m1", "m2", "m3"]
    assert client.models.retrieve("m2").id == "m2"


def test_chat_sglang_non_streaming(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(**chat(max_tokens=3))
    assert raw.headers["x-specroute-pool"] == "eagle"
    assert raw.headers["x-specroute-method"] == "eagle"
    assert raw.headers["x-specroute-k"] == "3"
    resp = raw.parse()
    assert resp.choices[0].message.content == "alpha beta gamma"
    assert resp.choices[0].finish_reason == "length"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (4, 3)
    facts = resp.model_extra["specroute"]
    assert facts["pool"] == "eagle" and facts["k"] == 3
    assert facts["verify_steps"] == 1 and facts["accept_length"] == 3.0


def test_completion_via_generate_with_stop(client: openai.OpenAI) -> None:
    resp = client.completions.create(model="m1", prompt=PROMPT, max_tokens=10, stop=["gamma"])
    assert resp.choices[0].text == "alpha beta"
    assert resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == 2
    assert resp.model_extra["specroute"]["accept_length"] == 2.0


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(
        **chat(), stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == PROMPT
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    last = chunks[-1]
    assert last.usage.completion_tokens == 4 and last.usage.total_tokens == 8
    assert last.model_extra["specroute"]["accept_length"] == 2.0


def test_completion_streaming_cumulative_upstream(client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model="m1", prompt=PROMPT, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_extra["specroute"]["pool"] == "eagle"


def test_vllm_passthrough_reads_spec_metrics(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(**chat("m2"))
    assert raw.headers["x-specroute-method"] == "eagle3"
    resp = raw.parse()
    assert resp.choices[0].message.content == PROMPT
    assert resp.model_extra["specroute"] == {
        "pool": "vllm-eagle3", "method": "eagle3", "k": 4, "verify_steps": 2,
        "accept_length": 2.0, "reason": "first pool with a healthy worker"}
    chunks = list(client.chat.completions.create(**chat("m2"), stream=True))
    assert chunks[-1].model_extra["specroute"]["verify_steps"] == 2  # no include_usage asked


def test_tools_pass_through(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "echo", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}}}}]
    resp = client.chat.completions.create(**chat(), tools=tools)
    assert resp.choices[0].message.tool_calls[0].function.name == "echo"
    assert resp.choices[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError, match="tools"):
        client.chat.completions.create(**chat("m2"), tools=tools)


def test_json_schema_needs_constrained_pool(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert client.chat.completions.create(**chat(), response_format=fmt).choices
    with pytest.raises(openai.BadRequestError, match="constrained_decoding"):
        client.chat.completions.create(**chat("m2"), response_format=fmt)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"temperature": 3}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
    ({"top_p": "high"}, "top_p"),
    ({"n": 99}, "'n'"),
])
def test_invalid_requests_are_400(client: openai.OpenAI, kwargs: dict, match: str) -> None:
    with pytest.raises(openai.BadRequestError, match=match) as info:
        client.chat.completions.create(**{**chat(), **kwargs})
    assert info.value.status_code == 400


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError, match="nope"):
        client.chat.completions.create(**chat("nope"))


def test_bad_api_key_is_401(stack: dict) -> None:
    bad = openai.OpenAI(base_url=stack["url"] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key"):
        bad.chat.completions.create(**chat())
    response = httpx.post(stack["url"] + "/v1/chat/completions", json=chat())
    assert response.status_code == 401


def test_body_over_limit_is_413(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError, match="larger than") as info:
        client.chat.completions.create(**chat(content="x " * 40000))
    assert info.value.status_code == 413


def test_no_healthy_worker_is_503(client: openai.OpenAI, stack: dict) -> None:
    # the first probe decides; on a loaded machine it may not have landed yet
    wait_until(lambda: httpx.get(stack["url"] + "/ready").json()["models_ready"]["m3"] is False,
               10, "the gateway probes m3's only worker down")
    with pytest.raises(openai.APIStatusError, match="no healthy worker") as info:
        client.completions.create(model="m3", prompt="x")
    assert info.value.status_code == 503
    # the replica stays ready for the models it can serve; m3 says it cannot
    ready = httpx.get(stack["url"] + "/ready")
    assert ready.status_code == 200 and ready.json()["models_ready"]["m3"] is False
    assert ready.json()["models"]["m3"] == 0


def test_upstream_4xx_passes_through(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="TRIGGER_400"):
        client.completions.create(model="m1", prompt="TRIGGER_400")


def test_upstream_timeout_is_504(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError, match="timed out") as info:
        client.completions.create(model="m1", prompt="TRIGGER_SLOW")
    assert info.value.status_code == 504


def test_mid_stream_failure_raises_in_client(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIError, match="mid-stream"):
        list(client.completions.create(model="m1", prompt="a b c TRIGGER_MIDSTREAM_ERROR d",
                                       stream=True))


def test_rate_limit_is_429(stack: dict) -> None:
    limited = openai.OpenAI(base_url=stack["url"] + "/v1", api_key=LIMITED_KEY, max_retries=0)
    limited.completions.create(model="m1", prompt="x")
    limited.completions.create(model="m1", prompt="x")
    with pytest.raises(openai.RateLimitError, match="2 requests per minute"):
        limited.completions.create(model="m1", prompt="x")


def test_malformed_json_is_400(stack: dict) -> None:
    response = httpx.post(stack["url"] + "/v1/chat/completions", content=b"{nope",
                          headers={"Authorization": f"Bearer {KEY}",
                                   "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_json"


def test_metrics_count_requests_per_pool(client: openai.OpenAI, stack: dict) -> None:
    client.completions.create(model="m1", prompt=PROMPT)
    text = httpx.get(stack["url"] + "/metrics").text
    assert 'specroute_requests_total{method="eagle",ok="true",pool="eagle",task="chat"}' in text
    assert "specroute_accept_length_bucket" in text


def test_open_gateway_ready_and_incremental_upstream(stack: dict) -> None:
    assert httpx.get(stack["open"] + "/ready").status_code == 200
    anonymous = openai.OpenAI(base_url=stack["open"] + "/v1", api_key="unused", max_retries=0)
    chunks = list(anonymous.completions.create(model="m4", prompt=PROMPT, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == PROMPT
    assert chunks[-1].model_extra["specroute"]["pool"] == "incr"


def test_log_has_no_tracebacks(stack: dict) -> None:
    for name in ("gw", "open"):
        assert "Traceback" not in (Path(stack["logs"]) / f"{name}.log").read_text()
