"""What the worker saw of its batch reaches the gateway's telemetry: a real gateway process
(learned policy, real Redis) in front of a real embedded worker and an SGLang-shaped stub.
Each record in the Redis stream carries `batch` and `batch_draft_tokens` from the
embedded worker's `specroute_batch` on every route (/generate and the OpenAI routes,
streamed or not, plain or speculative), and None from a worker that does not say."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest
import redis
from conftest import stop_process
from gateway_harness import start_gateway, start_stubs, start_worker

from policies.keys import STREAM_KEY
from workers.models import BUNDLED_MODEL_DIR

POOLS = ("batch-embedded", "batch-stub")  # names no other test's records use


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("batch_telemetry")
    worker, worker_url = start_worker(tmp, "ngram", BUNDLED_MODEL_DIR)
    procs = [worker]
    try:
        stubs, urls = start_stubs(tmp, {"stub": ["--model", "m", "--method", "eagle"]})
        procs += stubs.values()
        config = {"redis_url": redis_server,
                  "pools": [{"name": POOLS[0], "engine": "embedded", "model": "tiny",
                             "workers": [worker_url], "method": "ngram", "k": 4,
                             "capabilities": {"max_context": 1024, "per_request_k": True}},
                            {"name": POOLS[1], "engine": "sglang", "model": "m",
                             "workers": [urls["stub"]], "method": "eagle", "k": 3}]}
        gateway, url = start_gateway(tmp, config, policy="learned")
        procs.append(gateway)
        yield {"gateway": url, "redis": redis.Redis.from_url(redis_server)}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def _records(client: redis.Redis) -> list[dict]:
    records = [orjson.loads(fields[b"r"]) for _, fields in client.xrange(STREAM_KEY)]
    return [r for r in records if r["pool"] in POOLS]


def _send(stack: dict, endpoint: str, body: dict, **headers: str) -> dict:
    """One request through the gateway; the telemetry record it left."""
    before = len(_records(stack["redis"]))
    response = httpx.post(f"{stack['gateway']}/v1/{endpoint}", json=body, headers=headers,
                          timeout=60)
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 10
    while len(records := _records(stack["redis"])) == before:
        assert time.monotonic() < deadline, "no telemetry record"
        time.sleep(0.05)
    return records[-1]


def _bodies(model: str, stream: bool) -> dict[str, dict]:
    return {"completions": {"model": model, "prompt": "def add(a, b):", "max_tokens": 8,
                            "temperature": 0, "stream": stream},
            "chat/completions": {"model": model, "max_tokens": 8, "temperature": 0,
                                 "stream": stream,
                                 "messages": [{"role": "user", "content": "Say hi."}]}}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_embedded_worker_batch_reaches_the_record(stack: dict, endpoint: str,
                                                  stream: bool) -> None:
    body = _bodies("tiny", stream)[endpoint]
    speculative = _send(stack, endpoint, body, **{"x-specroute-k": "4"})
    assert speculative["pool"] == POOLS[0] and speculative["output_tokens"] > 1
    # one request at a time: the worker's batch was this request alone
    assert speculative["batch"] == 1.0
    assert 0.0 <= speculative["batch_draft_tokens"] <= 4.0
    # alone in its batch: the batch's draft tokens per step are its own
    assert speculative["own_draft_tokens"] == pytest.approx(speculative["batch_draft_tokens"])
    plain = _send(stack, endpoint, body, **{"x-specroute-k": "0"})
    assert plain["k"] == 0 and plain["output_tokens"] > 1
    assert (plain["batch"], plain["batch_draft_tokens"], plain["own_draft_tokens"]) == (
        1.0, 0.0, 0.0)


def test_the_pool_offers_the_latest_reported_batch_to_the_policy(stack: dict) -> None:
    """Four requests at once on the embedded worker: it reports the batch they shared, and
    the gateway's explain (the view the policy decides on) shows it, fading towards 1."""
    body = _bodies("tiny", False)["chat/completions"] | {"max_tokens": 64}
    with httpx.Client(timeout=60) as client:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(
                lambda _: client.post(f"{stack['gateway']}/v1/chat/completions", json=body,
                                      headers={"x-specroute-pool": POOLS[0]}), range(4)))
        assert all(a.status_code == 200 for a in answers)
        batches = [r["batch"] for r in _records(stack["redis"])[-4:]]

        def reported() -> float:
            explain = client.post(f"{stack['gateway']}/v1/routing/explain", json=body).json()
            (entry,) = [c for c in explain["candidates"] if c["pool"] == POOLS[0]]
            return entry["reported_batch"]

        first = reported()
        time.sleep(1.0)
        later = reported()
    assert 1.0 < later < first <= 4.0, (batches, first, later)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("endpoint", ["completions", "chat/completions"])
def test_a_worker_that_does_not_say_leaves_none(stack: dict, endpoint: str,
                                                stream: bool) -> None:
    record = _send(stack, endpoint, _bodies("m", stream)[endpoint])
    assert record["pool"] == POOLS[1] and record["verify_steps"]
    assert record["batch"] is None and record["batch_draft_tokens"] is None
    assert record["own_draft_tokens"] is None
