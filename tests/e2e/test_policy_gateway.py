"""The learned policy inside real gateway processes, on a real Redis, with stub workers.

Two gateways (A and B) share one Redis; the stubs report different accept lengths per
pool. Traffic goes through A only (cold-start tries, as pinned requests teach nothing);
both must end up routing the class to the pool with the best observed accept length, telemetry lands in the Redis stream, fixed-k pools get
a desired k in Redis, and a per-request-k pool receives the policy's k.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import redis
from conftest import stop_process
from gateway_harness import start_gateway, start_stubs, stats

from policies.keys import STREAM_KEY, desired_k_key

CODE = ("Fix the bug in this function:\n```python\ndef add(a, b):\n    return a - b\n```"
        " and explain the fix in one sentence please")
NGRAM_ACCEPT, EAGLE3_ACCEPT = 3.6, 1.2
STEP_S = "0.003"  # the stubs take this long per verify step, like a real engine


def chat(model: str, content: str = CODE, **extra: object) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": 64, "temperature": 0, **extra}


def pool(name: str, method: str, url: str, model: str = "m", **caps: object) -> dict:
    return {"name": name, "engine": "sglang", "method": method, "k": 0 if method == "plain"
            else 3, "model": model, "workers": [url], "capabilities": caps}


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("policy_gw")
    client = redis.Redis.from_url(redis_server)
    client.flushall()
    procs, urls = start_stubs(tmp, {
        "ngram": ["--model", "m", "--method", "ngram", "--k", "3", "--step-s", STEP_S,
                  "--accept-length", str(NGRAM_ACCEPT)],
        "eagle3": ["--model", "m", "--method", "eagle3", "--k", "3", "--step-s", STEP_S,
                   "--accept-length", str(EAGLE3_ACCEPT)],
        "perk": ["--model", "m2", "--method", "eagle", "--k", "3", "--accept-length", "8"],
        "json": ["--model", "m3", "--method", "eagle", "--no-constrained"],
    })
    config = {"redis_url": redis_server,
              # cold start tries each pool 8 times per context (it needs exploration on;
              # the rate is negligible): pinned requests no longer teach the policy
              "policy": {"explore_rate": 1e-9, "cold_start_samples": 8.0,
                         "refit_interval_s": 0.5, "relaunch_min_samples": 4.0,
                         # the checks below read the stubs' priors exactly: a per-request
                         # drafter scale (the predictor, tests/policies/test_predictor.py)
                         # would move them
                         "request_prediction": False},
              "server": {"health_interval_s": 0.5},
              "pools": [pool("ngram", "ngram", urls["ngram"]),
                        pool("eagle3", "eagle3", urls["eagle3"]),
                        {**pool("perk", "eagle", urls["perk"], "m2", per_request_k=True),
                         "engine": "embedded"},
                        pool("json", "eagle", urls["json"], "m3")]}
    gateways = {}
    try:
        for name in ("a", "b"):
            proc, url = start_gateway(tmp, config, policy="learned", name=f"gateway-{name}")
            procs[f"gateway-{name}"], gateways[name] = proc, url
        for url in gateways.values():
            wait_for(lambda u=url: httpx.get(u + "/ready", timeout=2).status_code == 200)
        yield {"gateways": gateways, "stubs": urls, "redis": client, "logs": tmp}
    finally:
        for proc in procs.values():
            stop_process(proc)
        client.close()


def explain(url: str, body: dict, **headers: str) -> dict:
    response = httpx.post(url + "/v1/routing/explain", json=body, headers=headers, timeout=5)
    assert response.status_code == 200, response.text
    return response.json()


def test_learns_the_best_pool_and_replicas_agree(stack: dict) -> None:
    a, b = stack["gateways"]["a"], stack["gateways"]["b"]
    cold = explain(b, chat("m"))
    assert cold["profile"]["task"] == "edit"  # a fix of the code it gives: copy-heavy
    assert cold["decision"]["pool"] in ("eagle3", "ngram")

    def server_prior() -> bool:  # the stubs' /server_info: average accept length 3 at k 3
        decision = explain(b, chat("m"))["decision"]
        return decision["predicted_accept_length"] == pytest.approx(3.0, abs=0.01)

    wait_for(server_prior)  # not the flat prior's E(0.5, 3) = 1.9
    with httpx.Client(base_url=a, timeout=5) as client:
        for _ in range(16):  # cold-start tries reach both pools, through A only
            response = client.post("/v1/chat/completions", json=chat("m"))
            assert response.status_code == 200, response.text
        pinned = client.post("/v1/chat/completions", json=chat("m"),
                             headers={"x-specroute-pool": "eagle3"})  # teaches nothing
        assert pinned.status_code == 200, pinned.text

        def routed_by_policy() -> str:
            return explain(a, chat("m"))["decision"]["pool"]

        wait_for(lambda: routed_by_policy() == "ngram")
        for _ in range(6):
            response = client.post("/v1/chat/completions", json=chat("m"))
            assert response.status_code == 200
            assert response.headers["x-specroute-pool"] == "ngram"
            assert response.json()["specroute"]["k"] == 3  # fixed-k pool: its launch k
    # B saw no traffic: it learns from the shared Redis and decides as A does, once both
    # have refitted on the same aggregates (~1 s read cache + 0.5 s refit); predictions
    # differ only by the decay between the two reads
    def same() -> bool:
        da, db = explain(a, chat("m"))["decision"], explain(b, chat("m"))["decision"]
        numbers = ("predicted_accept_length", "predicted_tokens_per_s")
        return all(da[key] == pytest.approx(db[key], rel=2e-3) for key in numbers) and \
            {**da, **dict.fromkeys(numbers)} == {**db, **dict.fromkeys(numbers)}

    wait_for(same)
    decision = explain(b, chat("m"))["decision"]
    assert (decision["pool"], decision["k"], decision["fallbacks"]) == ("ngram", 3, ["eagle3"])


def test_telemetry_reaches_the_redis_stream(stack: dict) -> None:
    client: redis.Redis = stack["redis"]
    last = client.xrevrange(STREAM_KEY, count=1)
    since = last[0][0] if last else b"0"
    body = chat("m")
    response = httpx.post(stack["gateways"]["a"] + "/v1/chat/completions", json=body,
                          headers={"x-specroute-pool": "eagle3"}, timeout=5)
    assert response.status_code == 200

    def ours() -> list[dict]:  # records of earlier tests may still be on their way
        records = [orjson.loads(fields[b"r"])
                   for _, fields in client.xrange(STREAM_KEY, min=b"(" + since)]
        return [r for r in records if r["pinned"] and r["pool"] == "eagle3"]

    wait_for(lambda: bool(ours()), timeout=5)
    record = ours()[-1]
    words = len(CODE.split())
    assert record | {"ttft_s": 0, "itl_s": 0, "e2e_s": 0, "timestamp": 0} == {
        "model": "m", "pool": "eagle3", "method": "eagle3", "k": 3, "task": "edit",
        "temperature_bucket": "t0", "prompt_tokens": words, "output_tokens": words,
        "verify_steps": response.json()["specroute"]["verify_steps"],
        "accept_length": pytest.approx(EAGLE3_ACCEPT, abs=0.2), "load": 0,
        "ttft_s": 0, "itl_s": 0, "e2e_s": 0, "tenant": "default", "slo_met": True,
        "ok": True, "timestamp": 0, "workers": 1, "extra": {}, "pinned": True,
        # an SGLang stub says nothing of its batch, nor a histogram of its accepted drafts
        "batch": None, "batch_draft_tokens": None, "own_draft_tokens": None,
        "accept_scale": 1.0, "accept_histogram": None}
    assert 0 < record["ttft_s"] <= record["e2e_s"] < 5 and record["itl_s"] > 0


def test_fixed_k_pools_get_a_desired_k_in_redis(stack: dict) -> None:
    client: redis.Redis = stack["redis"]
    explain(stack["gateways"]["a"], chat("m"))  # the policy has seen both pools
    # publishing waits while a fixed pool is out of service: a stub missing its health
    # probes on a loaded machine holds it back for a few probe intervals
    wait_for(lambda: client.get(desired_k_key("ngram")) is not None)
    wait_for(lambda: client.get(desired_k_key("eagle3")) is not None)
    assert 0 <= int(client.get(desired_k_key("ngram"))) <= 16


def test_per_request_k_reaches_the_worker(stack: dict) -> None:
    url, worker = stack["gateways"]["a"], stack["stubs"]["perk"]
    for body in (chat("m2"), chat("m2", stream=True)):
        response = httpx.post(url + "/v1/chat/completions", json=body, timeout=5)
        assert response.status_code == 200
        k = int(response.headers["x-specroute-k"])
        if body.get("stream"):
            facts = [orjson.loads(line[6:]) for line in response.text.splitlines()
                     if line.startswith("data: {")][-1]["specroute"]
        else:
            facts = response.json()["specroute"]
        assert facts["k"] == k == stats(worker)["last_k"]
        assert 0 <= k <= 16


def test_json_object_without_constrained_pool_is_served_unenforced(stack: dict) -> None:
    url = stack["gateways"]["a"]
    body = chat("m3", "List three fruits as JSON", response_format={"type": "json_object"})
    for stream in (False, True):
        response = httpx.post(url + "/v1/chat/completions", json={**body, "stream": stream},
                              timeout=5)
        assert response.status_code == 200, response.text  # the stub 400s on response_format
        assert response.headers["x-specroute-warning"] == (
            "response_format json_object not enforced by pool json")
    answer = explain(url, body)
    assert answer["profile"]["task"] == "structured"
    assert answer["warnings"] == ["response_format json_object not enforced by pool json"]
    plain = httpx.post(url + "/v1/chat/completions", json=chat("m3"), timeout=5)
    assert "x-specroute-warning" not in plain.headers
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    refused = httpx.post(url + "/v1/chat/completions",
                         json={**body, "response_format": schema}, timeout=5)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unsupported_capability"


def test_logs_are_clean(stack: dict) -> None:
    for name in ("gateway-a", "gateway-b"):
        log = Path(stack["logs"], f"{name}.log").read_text()
        assert "Traceback" not in log and "refit failed" not in log, log[-2000:]


def test_a_policy_without_a_pool_answers_503() -> None:
    from gateway.classifier.minimal import minimal_profile
    from gateway.config import parse_config
    from gateway.errors import NoHealthyWorker
    from gateway.pools import build_pools
    from gateway.routing.router import PoolRouter
    from gateway.schemas import parse_request
    from policies.protocol import Rule

    def no_pool(profile: object, pools: object) -> None:
        raise ValueError("no healthy pool to decide between")

    config = parse_config({"pools": [pool("p", "eagle", "http://a:1")]})
    pools = build_pools(config)
    pools["p"].workers[0].healthy = True
    request = parse_request(chat("m"), "chat")
    with pytest.raises(NoHealthyWorker) as info:
        PoolRouter(pools, Rule(no_pool, "none")).route(request, minimal_profile(request, "t"))
    assert info.value.status == 503 and info.value.code == "no_healthy_worker"


def test_json_object_prefers_constrained_pools_and_strips_elsewhere() -> None:
    from gateway.classifier.minimal import minimal_profile
    from gateway.config import parse_config
    from gateway.pools import build_pools
    from gateway.routing.router import JSON_OBJECT_PREFERENCE, PoolRouter
    from gateway.schemas import parse_request
    from gateway.upstream.dispatch import for_pool, warning_headers
    from policies.protocol import Rule
    from policies.rules import first_healthy

    config = parse_config({"pools": [pool("free", "eagle", "http://a:1"),
                                     pool("json", "eagle", "http://b:1",
                                          constrained_decoding=True)]})
    pools = build_pools(config)
    for p in pools.values():
        p.workers[0].healthy = True
    router = PoolRouter(pools, Rule(first_healthy, "first"))
    request = parse_request(chat("m", response_format={"type": "json_object"}), "chat")
    profile = minimal_profile(request, "t")
    assert profile.task == "structured" and not profile.needs_constrained
    why = {a.pool.name: a.excluded for a in router.assess(request, profile)}
    assert why == {"free": JSON_OBJECT_PREFERENCE, "json": None}
    assert router.route(request, profile)[0].pool == "json"
    assert for_pool(request, pools["json"]) is request
    pools["json"].workers[0].healthy = False  # no pool can enforce it now: served anyway
    decision, order = router.route(request, profile)
    assert decision.pool == "free" and [p.name for p in order] == ["free"]
    stripped = for_pool(request, pools["free"])
    assert stripped.response_format is None and "response_format" not in stripped.body
    assert request.body["response_format"] == {"type": "json_object"}  # the client's is kept
    assert warning_headers(request, pools["free"]) == [
        (b"x-specroute-warning", b"response_format json_object not enforced by pool free")]
