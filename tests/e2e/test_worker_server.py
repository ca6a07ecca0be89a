"""The embedded worker through real HTTP: `specroute worker` as a subprocess.

The model is a random tiny Llama with a tokenizer trained here on a few KB of text,
so the test needs no downloads and no training artefacts; what is checked is the wire
surface (SGLang 0.5.23 shapes), scheduling and error handling, not output quality.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, short_id, start_process, stop_process, wait_http

TEXT = [
    "def add(a, b):\n    return a + b\n",
    '{"name": "specroute", "kind": "gateway", "tokens": [1, 2, 3]}\n',
    "Speculative decoding drafts tokens and verifies them in one target pass.\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
] * 20
CONTEXT = 2048  # room for a generation long enough to outlast a client disconnect


# What the worker measured about itself (hand-made; `specroute bench engine
# --write-measured` writes the real one): served in /server_info and its registry entry.
MEASURED = {"model": "tiny", "source": "hand-made", "measured_at": "2026-11-30",
            "device": "cpu", "entries": [
                {"method": "ngram", "k": 4, "task": "code", "temperature": 0.0,
                 "accept_length": 2.5, "tokens_per_s": 30.0, "speedup": 1.8, "requests": 6}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_models import tiny_model_dir

    folder = tiny_model_dir(tmp_path_factory.mktemp("tiny-model"), TEXT, 320, CONTEXT)
    (folder / "measured.json").write_text(json.dumps(MEASURED))
    return folder


@pytest.fixture(scope="module")
def worker(model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
           redis_server: str) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("worker-log") / "worker.log"
    proc = start_process(["-m", "specroute.cli", "worker", "--method", "ngram", "--port", str(port),
                          "--model", str(model_dir), "--threads", "1",
                          "--redis-url", redis_server, "--pool", "worker-test"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=60, proc=proc)
    except (RuntimeError, TimeoutError):
        stop_process(proc)
        raise AssertionError(log.read_text()) from None
    yield url
    stop_process(proc)


def greedy(max_new_tokens: int, **extra: object) -> dict:
    return {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True, **extra}


def sse_events(body: str) -> list[str]:
    assert body.endswith("data: [DONE]\n\n")
    chunks = [c for c in body.split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks)
    return [c[len("data: "):] for c in chunks]


def test_generate_returns_sglang_fields(worker: str) -> None:
    r = httpx.post(f"{worker}/generate", json={
        "text": "def add(a, b):", "rid": "req-1", "sampling_params": greedy(8)}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"text", "output_ids", "meta_info"}
    meta = body["meta_info"]
    assert meta["id"] == "req-1"
    assert meta["completion_tokens"] == len(body["output_ids"]) == 8
    assert isinstance(meta["prompt_tokens"], int) and meta["prompt_tokens"] > 0
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert isinstance(meta["e2e_latency"], float) and meta["e2e_latency"] > 0
    assert meta["spec_verify_ct"] >= 1
    assert meta["spec_accept_length"] == pytest.approx(8 / meta["spec_verify_ct"])
    assert isinstance(meta["spec_accept_rate"], float)
    assert isinstance(meta["spec_num_correct_drafts"], int)
    assert isinstance(meta["spec_num_proposed_drafts"], int)


def test_generate_stream_is_cumulative_and_ends_with_done(worker: str) -> None:
    r = httpx.post(f"{worker}/generate", json={
        "text": "The quick brown fox", "stream": True, "sampling_params": greedy(6)}, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert len(last["output_ids"]) == last["meta_info"]["completion_tokens"] == 6
    assert "spec_verify_ct" in last["meta_info"] and "e2e_latency" in last["meta_info"]


def test_per_request_k_and_method_via_custom_params(worker: str) -> None:
    def meta(custom: dict) -> dict:
        r = httpx.post(f"{worker}/generate", json={
            "text": "a b a b a b a b", "sampling_params": greedy(12, custom_params=custom)},
            timeout=30)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]

    k2 = meta({"num_speculative_tokens": 2})
    assert k2["spec_num_proposed_drafts"] <= 2 * k2["spec_verify_ct"]
    assert "spec_verify_ct" not in meta({"num_speculative_tokens": 0})  # k = 0: plain decoding
    assert "spec_verify_ct" not in meta({"method": "plain"})


def test_every_answer_says_its_batch(worker: str) -> None:
    """`specroute_batch` in the final meta_info and in sglext, plain and speculative; one
    request at a time here, so its batch is itself alone."""
    plain = httpx.post(f"{worker}/generate", json={"text": "a b a b", "sampling_params": greedy(
        8, custom_params={"num_speculative_tokens": 0})}, timeout=30).json()["meta_info"]
    decode = plain["specroute_batch"].pop("decode_s")
    assert plain["specroute_batch"] == {"requests": 1.0, "draft_tokens": 0.0, "steps": 7}
    assert 0.0 < decode < plain["e2e_latency"]  # the 7 steps after the first token
    r = httpx.post(f"{worker}/generate", json={"text": "a b a b a b a b", "stream": True,
                                               "sampling_params": greedy(12)}, timeout=30)
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    assert all("specroute_batch" not in c["meta_info"] for c in chunks[:-1])
    meta = chunks[-1]["meta_info"]
    batch, steps = meta["specroute_batch"], meta["spec_verify_ct"] - 1  # less the prefill
    assert 0.0 < batch.pop("decode_s") < meta["e2e_latency"]
    assert batch == {"requests": 1.0, "steps": steps,
                     "draft_tokens": pytest.approx(meta["spec_num_proposed_drafts"] / steps)}
    chat = httpx.post(f"{worker}/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "temperature": 0, "ignore_eos": True, "custom_params": {"method": "plain"}},
        timeout=30).json()
    assert chat["sglext"]["specroute_batch"].pop("decode_s") > 0.0
    assert chat["sglext"] == {"specroute_batch": {"requests": 1.0, "draft_tokens": 0.0,
                                                  "steps": 3}}
    r = httpx.post(f"{worker}/v1/completions", json={
        "model": "tiny", "prompt": "a b a b a b", "max_tokens": 6, "temperature": 0,
        "ignore_eos": True, "stream": True, "return_spec_tokens_details": True}, timeout=30)
    ext = [json.loads(e) for e in sse_events(r.text)[:-1]][-1]["sglext"]
    steps = ext["spec_tokens_details"]["spec_verify_ct"] - 1
    assert ext["specroute_batch"]["steps"] == steps and ext["specroute_batch"]["requests"] == 1.0
    assert ext["specroute_batch"]["draft_tokens"] == pytest.approx(
        ext["spec_tokens_details"]["spec_num_proposed_drafts"] / steps)


@pytest.mark.parametrize("content, message", [
    (b"{not json", "malformed JSON"),
    (json.dumps({"text": ""}), "text is empty"),
    (json.dumps({"text": "a", "sampling_params": {"max_new_tokens": 0}}), "max_new_tokens"),
    (json.dumps({"text": "a", "sampling_params": {"temperature": "hot"}}), "temperature"),
    (json.dumps({"text": "a", "sampling_params": {"json_schema": "{not json"}}),
     "invalid json_schema"),
    (json.dumps({"text": "a", "sampling_params": {"regex": "(a"}}), "invalid regex"),
    (json.dumps({"text": "a", "sampling_params": {"custom_params": {"method": "nope"}}}),
     "unknown method"),
    (json.dumps({"text": "a", "sampling_params": {"custom_params":
                                                   {"num_speculative_tokens": 999}}}), ""),
    (json.dumps({"input_ids": [1] * (CONTEXT + 10)}), "context length"),
    (json.dumps({"text": ["a", "b"]}), "batch"),
    (json.dumps({"text": "a", "sampling_params": {"logit_bias": {"\u00b2": 1}}}), "logit_bias"),
    (json.dumps({"text": "a", "sampling_params": {"logit_bias": {"\u0663": 1}}}), "logit_bias"),
], ids=short_id)
def test_bad_input_is_400_with_a_message(worker: str, content: bytes | str, message: str) -> None:
    r = httpx.post(f"{worker}/generate", content=content, timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"] and r.json()["error"]["message"]


def test_server_info_and_metrics_carry_sglang_names(worker: str) -> None:
    httpx.post(f"{worker}/generate", json={"text": "x", "sampling_params": greedy(3)}, timeout=30)
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(f"{worker}{path}").json()
        assert info["speculative_algorithm"] == "NGRAM"
        assert info["speculative_num_draft_tokens"] == info["speculative_num_steps"] + 1
        assert "speculative_eagle_topk" in info and "model_path" in info
        state = info["internal_states"][0]
        assert state["avg_spec_accept_length"] >= 1.0
        assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0
        assert info["specroute_measured"] == MEASURED
    assert httpx.get(f"{worker}/model_info").json()["is_generation"] is True
    models = httpx.get(f"{worker}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["max_model_len"] == CONTEXT
    text = httpx.get(f"{worker}/metrics").text
    for name in ("sglang:spec_accept_length", "sglang:spec_accept_rate", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:generation_tokens_total",
                 "sglang:prompt_tokens_total"):
        assert f"\n{name}{{" in f"\n{text}", name
    assert httpx.get(f"{worker}/health_generate").status_code == 200


def test_openai_chat_returns_sglext_spec_details(worker: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{worker}/v1", api_key="none", max_retries=0)
    try:
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Say hi."}], max_tokens=5,
            temperature=0, extra_body={"return_spec_tokens_details": True, "ignore_eos": True})
    finally:
        client.close()
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    details = reply.model_extra["sglext"]["spec_tokens_details"]
    assert details["spec_verify_ct"] >= 1 and "spec_accept_length" in details


def test_openai_completion_stream_has_sglext_usage_and_done(worker: str) -> None:
    r = httpx.post(f"{worker}/v1/completions", json={
        "model": "tiny", "prompt": "def add(a, b):", "max_tokens": 4, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
        "return_spec_tokens_details": True}, timeout=30)
    assert r.status_code == 200
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    text_chunks = [c for c in chunks if c["choices"]]
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["sglext"]["spec_tokens_details"]["spec_verify_ct"] >= 1
    assert chunks[-1]["usage"]["completion_tokens"] == 4


SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"enum": [1, 2, 3]}},
          "required": ["ok", "n"], "additionalProperties": False}


def test_openai_n_logprobs_and_json_schema(worker: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{worker}/v1", api_key="none", max_retries=0)
    try:
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "JSON please."}], n=3,
            max_tokens=30, temperature=1.0, seed=5, logprobs=True, top_logprobs=2,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "s", "schema": SCHEMA, "strict": True}})
    finally:
        client.close()
    assert [c.index for c in reply.choices] == [0, 1, 2]
    tokens = 0
    for choice in reply.choices:
        doc = json.loads(choice.message.content or "")
        assert isinstance(doc["ok"], bool) and doc["n"] in (1, 2, 3)
        assert choice.finish_reason == "stop" and choice.logprobs is not None
        content = choice.logprobs.content or []
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)
        tokens += len(content)
    assert reply.usage is not None and reply.usage.completion_tokens == tokens


def test_generate_logprobs_and_streamed_n(worker: str) -> None:
    r = httpx.post(f"{worker}/generate", json={
        "text": "def add", "return_logprob": True, "top_logprobs_num": 3,
        "return_text_in_logprobs": True, "sampling_params": greedy(4)}, timeout=30)
    meta = r.json()["meta_info"]
    assert [e[1] for e in meta["output_token_logprobs"]] == r.json()["output_ids"]
    assert all(len(top) == 3 and top[0][1] == e[1] and isinstance(top[0][2], str)
               for e, top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"],
                                 strict=True))
    r = httpx.post(f"{worker}/v1/completions", json={
        "model": "tiny", "prompt": "def add(a, b):", "max_tokens": 3, "n": 2, "stream": True,
        "ignore_eos": True, "stream_options": {"include_usage": True}}, timeout=30)
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    finished = [c["choices"][0]["index"] for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1] and chunks[-1]["usage"]["completion_tokens"] == 6


def running_requests(worker: str) -> int:
    return httpx.get(f"{worker}/server_info").json()["internal_states"][0]["num_running_reqs"]


def wait_until_idle(worker: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while running_requests(worker) != 0:
        if time.monotonic() > deadline:
            raise AssertionError("the worker still runs requests")
        time.sleep(0.05)


async def test_short_request_overtakes_a_long_one(worker: str) -> None:
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", f"{worker}/generate", json={
                "text": "x", "stream": True,
                "sampling_params": greedy(CONTEXT - 8, custom_params={"method": "plain"})}) as long:
            lines = long.aiter_lines()  # held: a dropped iterator closes the stream
            while not (await anext(lines)).startswith("data: "):
                pass  # the long request is decoding once its first tokens are out
            r = await client.post(f"{worker}/generate", json={
                "text": "x", "sampling_params": greedy(4, custom_params={"method": "plain"})})
            assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
            # the short one is done while the long one (2040 tokens) still holds its slot
            assert (await client.get(f"{worker}/server_info")).json()[
                "internal_states"][0]["num_running_reqs"] == 1
    wait_until_idle(worker)  # leaving the stream disconnected the long request


def test_client_disconnect_frees_the_slot(worker: str) -> None:
    def aborted() -> float:
        for line in httpx.get(f"{worker}/metrics").text.splitlines():
            if line.startswith("sglang:num_aborted_requests_total"):
                return float(line.split()[-1])
        raise AssertionError("no sglang:num_aborted_requests_total")

    before = aborted()
    started = time.monotonic()
    with httpx.stream("POST", f"{worker}/generate", timeout=30, json={
        "text": "x", "stream": True,
        "sampling_params": greedy(CONTEXT - 8, custom_params={"method": "plain"})}) as r:
        next(r.iter_lines())
    while time.monotonic() < started + 20:
        state = httpx.get(f"{worker}/server_info").json()["internal_states"][0]
        if state["num_running_reqs"] == 0 and aborted() > before:
            return  # cancelled (not finished) and its slot is free again
        time.sleep(0.05)
    raise AssertionError("the disconnected request kept its slot")


def test_worker_registers_in_redis(worker: str, redis_server: str) -> None:
    import redis

    from workers.fleet.registry import list_workers

    client = redis.Redis.from_url(redis_server)
    try:
        infos = list_workers(client, "worker-test")
    finally:
        client.close()
    assert [(i.url, i.engine, i.method) for i in infos] == [(worker, "embedded", "ngram")]
    assert infos[0].k == httpx.get(f"{worker}/server_info").json()["speculative_num_steps"]
    assert infos[0].measured == MEASURED
