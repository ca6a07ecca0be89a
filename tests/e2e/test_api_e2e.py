"""The API surface through a real gateway and a real embedded worker, with the official
openai client: JSON schema under every speculative method, n, logprobs.

One worker serves the bundled tiny model (every drafter) to one pool per method; the
request picks the method by pinning its pool (`x-specroute-pool`): the gateway, never
the client, sets the worker's method and k (`custom_params`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import stop_process
from gateway_harness import start_gateway, start_worker

from workers.models import BUNDLED_MODEL_DIR

METHODS = ("plain", "ngram", "lookahead", "medusa", "eagle", "eagle2", "hybrid", "draft")
SCHEMA = {"type": "object",
          "properties": {"event": {"type": "string", "maxLength": 16},
                         "user_id": {"type": "integer", "minimum": 0, "maximum": 99999},
                         "ok": {"type": "boolean"}},
          "required": ["event", "user_id", "ok"], "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Log the event as JSON."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("api")
    worker, url = start_worker(tmp, "ngram", BUNDLED_MODEL_DIR)
    procs = [worker]
    try:
        gateway_proc, gateway = start_gateway(tmp, {"pools": [
            {"name": name, "engine": "embedded", "model": "tiny", "workers": [url],
             "method": method, "k": 4,
             "capabilities": {"max_context": 1024, "constrained_decoding": True,
                              "tools": True, "per_request_k": True}}
            for name, method in [("e", "ngram")] + [(f"m-{m}", m) for m in METHODS[1:]]]})
        procs.append(gateway_proc)
        yield {"gateway": gateway, "worker": url, "tmp": Path(tmp)}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


@pytest.fixture(scope="module")
def client(stack: dict) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=stack["gateway"] + "/v1", api_key="none", max_retries=0,
                      timeout=120)
    yield c
    c.close()


def _via(method: str, **extra_body: object) -> dict:
    """Request options that pick `method` on the worker: plain is k = 0 (pinned)."""
    if method == "plain":
        return {"extra_headers": {"x-specroute-k": "0"}, "extra_body": extra_body}
    return {"extra_headers": {"x-specroute-pool": f"m-{method}"}, "extra_body": extra_body}


def _valid(doc: dict) -> bool:
    return (set(doc) == set(SCHEMA["required"]) and isinstance(doc["event"], str)
            and isinstance(doc["user_id"], int) and isinstance(doc["ok"], bool))


def test_json_schema_for_every_method_is_valid_and_identical(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "event", "schema": SCHEMA,
                                                  "strict": True}}
    answers = {}
    for method in METHODS:
        reply = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=60, temperature=0,
            response_format=fmt, **_via(method))
        content = reply.choices[0].message.content or ""
        assert _valid(json.loads(content)), (method, content)
        assert reply.choices[0].finish_reason == "stop"
        answers[method] = content
    assert all(a == answers["plain"] for a in answers.values()), answers


def test_json_schema_streamed_and_sampled(client: openai.OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "event", "schema": SCHEMA}}
    stream = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=80, temperature=1.0, seed=3, stream=True,
        response_format=fmt, **_via("eagle2"))
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert _valid(json.loads(text))


def test_n_returns_independent_choices_with_usage_summed(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, n=3,
                                           max_tokens=8, temperature=1.0, seed=11)
    assert sorted(c.index for c in reply.choices) == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) > 1
    assert reply.usage is not None and 3 <= reply.usage.completion_tokens <= 24
    stream = client.completions.create(model="tiny", prompt="def add(a, b):", n=2,
                                       max_tokens=4, stream=True, temperature=1.0)
    finished = {c.choices[i].index for c in stream for i in range(len(c.choices))
                if c.choices[i].finish_reason}
    assert finished == {0, 1}


def test_logprobs_are_the_targets(client: openai.OpenAI) -> None:
    def logprobs(method: str) -> list:
        reply = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, logprobs=True,
            top_logprobs=2, **_via(method, ignore_eos=True))
        content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content is not None and len(content) == 12
        return [(t.token, t.logprob, [a.token for a in t.top_logprobs]) for t in content]

    plain = logprobs("plain")
    for method in ("ngram", "eagle2"):
        spec = logprobs(method)
        assert [t[0] for t in spec] == [t[0] for t in plain]
        assert [t[2] for t in spec] == [t[2] for t in plain]
        assert all(abs(a[1] - b[1]) < 1e-4 for a, b in zip(spec, plain, strict=True))
    completion = client.completions.create(model="tiny", prompt="def add(a, b):",
                                           max_tokens=3, temperature=0, logprobs=2)
    lp = completion.choices[0].logprobs
    assert lp is not None and len(lp.token_logprobs or []) == 3


def test_penalties_and_logit_bias_are_served_and_checked(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6,
                                           temperature=0, presence_penalty=1.5,
                                           frequency_penalty=1.0, logit_bias={"96": 100})
    assert reply.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        client.chat.completions.create(model="tiny", messages=MESSAGES,
                                       logit_bias={"x": 1})  # type: ignore[dict-item]
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, presence_penalty=3)


def test_sglang_native_generate_through_the_gateway(stack: dict) -> None:
    gateway = stack["gateway"]
    body = {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 8,
                                                          "temperature": 0, "ignore_eos": True}}
    r = httpx.post(gateway + "/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    meta = answer["meta_info"]
    assert meta["completion_tokens"] == 8 == len(answer["output_ids"])
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["spec_verify_ct"] >= 1 and meta["spec_accept_length"] >= 1.0
    assert r.headers["x-specroute-pool"] == "e"
    streamed = httpx.post(gateway + "/generate", json={**body, "stream": True}, timeout=60)
    events = [e[len("data: "):] for e in streamed.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["text"] == answer["text"]  # cumulative, as SGLang streams by default
    assert chunks[-1]["meta_info"]["spec_accept_length"] == pytest.approx(
        meta["spec_accept_length"])
    schema = httpx.post(gateway + "/generate", timeout=60, json={
        "text": "JSON:", "sampling_params": {"max_new_tokens": 60, "temperature": 0,
                                             "json_schema": json.dumps(SCHEMA)}})
    assert _valid(json.loads(schema.json()["text"]))
    bad = httpx.post(gateway + "/generate", json={"sampling_params": {}}, timeout=10)
    assert bad.status_code == 400 and "text" in bad.json()["error"]["message"]


def test_sglang_native_info_routes(stack: dict) -> None:
    gateway = stack["gateway"]
    info = httpx.get(gateway + "/server_info", timeout=10).json()
    assert info["internal_states"][0]["avg_spec_accept_length"] >= 1.0  # after the tests above
    assert info["internal_states"][1]["pool"] == "e"
    assert httpx.get(gateway + "/model_info", timeout=10).json()["model_path"] == "tiny"
    assert httpx.get(gateway + "/health_generate", timeout=10).status_code == 200


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "maxLength": 20},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _arguments(call) -> dict:  # noqa: ANN001 - an openai tool call
    args = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and set(args) == {"city", "unit"}
    assert args["unit"] in ("celsius", "fahrenheit") and call.id
    return args


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                           tool_choice="required", max_tokens=60,
                                           temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = (choice.message.tool_calls or [])[0]
    _arguments(call)
    follow_up = [*ASK, {"role": "assistant", "content": None,
                        "tool_calls": [call.model_dump()]},
                 {"role": "tool", "tool_call_id": call.id,
                  "content": '{"temperature": 21, "unit": "celsius"}'}]
    answer = client.chat.completions.create(model="tiny", messages=follow_up, tools=TOOLS,
                                            tool_choice="none", max_tokens=12, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content and not answer.choices[0].message.tool_calls
    auto = client.chat.completions.create(model="tiny", messages=ASK, tools=TOOLS,
                                          max_tokens=60, temperature=0)
    if auto.choices[0].finish_reason == "tool_calls":
        _arguments((auto.choices[0].message.tool_calls or [])[0])
    else:
        assert not (auto.choices[0].message.content or "").startswith("<")


def test_tool_call_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, max_tokens=60, temperature=0, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **_via("eagle2"))
    calls, finish, content = [], None, ""
    for chunk in stream:
        for choice in chunk.choices:
            calls += choice.delta.tool_calls or []
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls" and len(calls) == 1 and not content
    _arguments(calls[0])


def test_tool_call_without_max_tokens_ends_within_its_budget(client: openai.OpenAI) -> None:
    """No max_tokens, a string argument with no maxLength and arguments open to more
    keys: the grammar alone would let the model write until the context ends; the
    gateway's budget (server.default_max_tokens, bounded by the context left) ends it
    with a call or at `length`, never a hang."""
    open_tool = [{"type": "function", "function": {
        "name": "note", "description": "Keep a note",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]}}}]
    for temperature in (0.0, 1.0):
        reply = client.chat.completions.create(
            model="tiny", messages=ASK, tools=open_tool, tool_choice="required",
            temperature=temperature, seed=5, timeout=60)
        choice = reply.choices[0]
        assert choice.finish_reason in ("tool_calls", "length"), choice
        assert reply.usage is not None and reply.usage.completion_tokens <= 1024


def test_extreme_sampling_settings_sample(stack: dict) -> None:
    """Schemathesis's find (issue 24): `top_p` 5e-324 with n 13 and logprobs 4 was a
    worker 500 (every token cut: nan probabilities), a 502 here. Now the most likely
    token always stays: 13 greedy samples, the same text, finite logprobs."""
    body = {"model": "tiny", "prompt": "def add(a, b):", "top_p": 5e-324, "n": 13,
            "logprobs": 4, "max_tokens": 4}
    for extra in ({}, {"temperature": 1e-300}, {"temperature": 2, "top_p": 1e-300,
                                                "presence_penalty": -2,
                                                "logit_bias": {"5": 100}}):
        response = httpx.post(stack["gateway"] + "/v1/completions", json={**body, **extra},
                              timeout=60)
        assert response.status_code == 200, response.text
        choices = response.json()["choices"]
        assert len(choices) == 13 and len({c["text"] for c in choices}) == 1
        assert all(abs(lp) < 1e9 for c in choices for lp in c["logprobs"]["token_logprobs"])
