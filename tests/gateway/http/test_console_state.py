"""The console's state endpoint and its recent-traffic memory, in process: the shape of
`GET /v1/console/state`, the admin guard (Bearer, Basic, 401 with a challenge, 403 off
loopback without a key), the bounded sample ring and what it never holds."""

from __future__ import annotations

import base64
from dataclasses import asdict, fields, is_dataclass

import pytest
from starlette.testclient import TestClient

from gateway.classifier.minimal import minimal_profile
from gateway.compiled import COMPILED, module_name
from gateway.config import hash_api_key, parse_config
from gateway.http.app import create_app
from gateway.telemetry.recent import RecentConfig, RecentTraffic, percentile
from policies.types import RequestRecord

ADMIN = "console-admin-key"
TENANT_KEY = "sk-console-tenant"


def record(pool: str = "eagle", *, task: str = "code", tenant: str = "acme", ok: bool = True,
           tokens: int = 40, steps: int | None = 10, itl_s: float = 0.01, ttft_s: float = 0.05,
           at: float = 1000.0) -> RequestRecord:
    return RequestRecord(model="m", pool=pool, method="eagle" if pool == "eagle" else "plain",
                         k=3 if pool == "eagle" else 0, task=task, temperature_bucket="t0",
                         prompt_tokens=12, output_tokens=tokens, verify_steps=steps,
                         accept_length=tokens / steps if steps else 0.0, load=0, ttft_s=ttft_s,
                         itl_s=itl_s, e2e_s=ttft_s + itl_s * (tokens - 1), tenant=tenant, ok=ok,
                         slo_met=ok, timestamp=at)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_samples_are_one_per_interval_bounded_to_the_span_with_a_live_last_point() -> None:
    clock = Clock()
    recent = RecentTraffic(RecentConfig(sample_interval_s=10, span_s=60), clock=clock)
    for _ in range(10):
        recent.record(record(tokens=41, steps=10, itl_s=0.02))
        clock.now += 10
        assert recent.due()
        recent.sample()
        assert not recent.due()
    samples = recent.samples("eagle")
    assert len(samples) == 6  # span / interval: the oldest dropped
    assert [s.at for s in samples] == [1050.0 + 10 * i for i in range(6)]
    first = samples[0]
    assert first.requests == 1 and first.accept_length == pytest.approx(4.1)
    assert first.tokens_per_s == pytest.approx(50.0)  # 40 tokens after the first, 0.8 s
    assert first.output_tokens_per_s == pytest.approx(4.1)  # 41 tokens in 10 s
    recent.record(record(tokens=21, steps=None, itl_s=0.05))  # no counters: no acceptance
    clock.now += 4
    live = recent.samples("eagle")[-1]
    assert live.live and live.requests == 1 and live.seconds == pytest.approx(4.0)
    assert live.accept_length is None and live.tokens_per_s == pytest.approx(20.0)


def test_a_hybrid_pools_branch_counts_sum_over_the_hour_and_reach_metrics() -> None:
    """The record's `extra["drafts"]` (telemetry.record, from the worker's
    `specroute_drafts`): summed per pool over the ring and the open interval, dropped with
    the samples that held them, and counted in Prometheus per pool and branch."""
    from prometheus_client import CollectorRegistry

    from gateway.schemas import parse_request
    from gateway.telemetry.prometheus import PrometheusRecorder
    from gateway.telemetry.record import Outcome, Timer, request_record
    from gateway.telemetry.worker_stats import SpecStats, Usage
    from gateway.tenants.auth import DEFAULT_TENANT
    from policies.types import Decision

    clock = Clock()
    recent = RecentTraffic(RecentConfig(sample_interval_s=10, span_s=20), clock=clock)
    registry = CollectorRegistry()
    prometheus = PrometheusRecorder(registry)

    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")

    def hybrid(drafts: dict | None) -> RequestRecord:
        entry, _ = request_record(Outcome(
            request, minimal_profile(request, "acme"), DEFAULT_TENANT,
            Decision("hybrid", "hybrid", 3, "test"), Timer(), usage=Usage(10, 20), ok=True,
            spec=SpecStats(verify_steps=9, correct_drafts=11, drafts=drafts)), Timer().start)
        return entry

    first = hybrid({"ngram": (5, 9), "eagle": (3, 2), "none": (0, 0)})
    assert first.extra["drafts"] == {"ngram": (5, 9), "eagle": (3, 2), "none": (0, 0)}
    assert "drafts" not in hybrid(None).extra
    for entry in (first, hybrid({"ngram": (1, 0), "eagle": (6, 4), "none": (1, 0)})):
        recent.record(entry)
        prometheus.record(entry)
    recent.record(record())  # another pool: none of its own
    assert recent.drafts("hybrid") == {"ngram": (6, 9), "eagle": (9, 6), "none": (1, 0)}
    assert recent.drafts("eagle") is None
    clock.now += 10
    recent.sample()
    recent.record(hybrid({"ngram": (2, 3), "eagle": (0, 0), "none": (0, 0)}))
    assert recent.drafts("hybrid") == {"ngram": (8, 12), "eagle": (9, 6), "none": (1, 0)}
    for _ in range(3):  # the span is two samples: the first interval's counts age out
        clock.now += 10
        recent.sample()
    assert recent.drafts("hybrid") is None
    value = registry.get_sample_value
    assert value("specroute_draft_branch_steps_total", {"pool": "hybrid", "branch": "eagle"}) == 9
    assert value("specroute_draft_branch_accepted_tokens_total",
                 {"pool": "hybrid", "branch": "ngram"}) == 9


def test_a_pool_without_traffic_gets_empty_samples_and_failures_count() -> None:
    clock = Clock()
    recent = RecentTraffic(RecentConfig(sample_interval_s=10, span_s=100), clock=clock)
    recent.record(record(ok=False, tokens=0, steps=0))
    clock.now += 10
    recent.sample()
    clock.now += 10
    recent.sample()
    samples = recent.samples("eagle")
    assert [(s.requests, s.failed) for s in samples] == [(1, 1), (0, 0)]
    assert samples[1].accept_length is None and samples[1].tokens_per_s is None


def test_tenant_percentiles_attainment_and_the_last_decisions() -> None:
    recent = RecentTraffic(RecentConfig(decisions=5, window=100))
    for i in range(1, 101):
        recent.record(record(ttft_s=i / 1000, itl_s=i / 10000, ok=i % 10 != 0))
    latency = recent.tenant_latency("acme")
    assert latency.requests == 100 and latency.attainment == pytest.approx(0.9)
    assert latency.ttft_p50_ms == pytest.approx(49.0)  # the 45th of the 90 that finished
    assert latency.ttft_p99_ms == pytest.approx(99.0)
    assert latency.tpot_p50_ms == pytest.approx(4.9)
    decisions = recent.decisions()
    assert len(decisions) == 5 and decisions[0].ttft_ms == pytest.approx(100.0)
    assert set(asdict(decisions[0])) >= {"task", "pool", "k", "accept_length", "e2e_ms"}
    assert percentile([], 0.5) is None and percentile([3.0], 0.99) == 3.0


def config(admin: bool = True, loopback_admin: bool = False):
    server = {"health_interval_s": 3600, "loopback_admin": loopback_admin}
    if admin:
        server["admin_api_key_sha256"] = hash_api_key(ADMIN)
    return parse_config({
        "server": server,
        "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(TENANT_KEY)],
                     "slo_ttft_ms": 500, "slo_tpot_ms": 50, "rate_limit_rpm": 60}],
        "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3, "model": "m",
                   "workers": ["http://127.0.0.1:9"]},
                  {"name": "plain", "engine": "sglang", "method": "plain", "model": "m",
                   "workers": ["http://127.0.0.1:9"]},
                  {"name": "vllm-ngram", "engine": "vllm", "method": "ngram", "k": 4,
                   "model": "v", "workers": ["http://127.0.0.1:9"]}]})


@pytest.fixture
def client():
    app = create_app(config(), policy="learned", classify=minimal_profile)
    with TestClient(app) as client:
        for pool in app.state.gateway.pools.values():  # no worker listens: say they are up
            for worker in pool.workers:
                worker.healthy = True
        yield client


def admin_get(client: TestClient, path: str):
    return client.get(path, headers={"Authorization": f"Bearer {ADMIN}"})


def test_the_state_has_every_section_in_shape(client: TestClient) -> None:
    console = client.app.state.console
    for _ in range(3):
        console.recent.record(record("eagle"))
    console.recent.record(record("plain", task="chat", steps=40))
    response = admin_get(client, "/v1/console/state")
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    state = response.json()
    assert set(state) == {"gateway", "routing", "pools", "tenants", "fleet", "decisions"}
    assert state["gateway"]["policy"] == "learned" and state["gateway"]["models"] == ["m", "v"]
    assert state["gateway"]["sample_interval_s"] == 10.0
    assert len(state["routing"]) == 2 * 4 * 3  # models x tasks x temperature buckets
    row = next(r for r in state["routing"]
               if (r["model"], r["task"], r["temperature_bucket"]) == ("m", "code", "t0"))
    assert row["pool"] in {"eagle", "plain"} and row["reason"].startswith("code/t0")
    assert row["predicted_tokens_per_s"] > 0 and row["k"] in {0, 3}
    pools = {p["pool"]: p for p in state["pools"]}
    assert pools["plain"]["prior"]["accept_length"] == 1.0
    eagle = pools["eagle"]
    assert "flat default" in eagle["prior"]["source"] and eagle["prior"]["accept_length"] > 1
    assert eagle["samples"][-1]["live"] and eagle["samples"][-1]["requests"] == 3
    assert eagle["samples"][-1]["accept_length"] == pytest.approx(4.0)
    tenant = next(t for t in state["tenants"] if t["tenant"] == "acme")
    assert (tenant["slo_ttft_ms"], tenant["slo_tpot_ms"], tenant["rate_limit_rpm"]) == (500, 50, 60)
    assert tenant["requests"] == 4 and tenant["attainment"] == 1.0
    assert tenant["ttft_p50_ms"] == pytest.approx(50.0) and tenant["shed"] == 0
    vllm = pools["vllm-ngram"]  # a vLLM pool reads the same state: no /server_info prior
    assert vllm["engine"] == "vllm" and "flat default" in vllm["prior"]["source"]
    assert vllm["samples"] == []
    assert {r["pool"] for r in state["routing"] if r["model"] == "v"} == {"vllm-ngram"}
    fleet = state["fleet"][0]
    assert fleet["model"] == "m" and fleet["planner"].startswith("off")
    vllm_fleet = state["fleet"][1]["pools"][0]
    assert vllm_fleet["pool"] == "vllm-ngram" and vllm_fleet["desired_k"] in (None, 4)
    by_pool = {p["pool"]: p for p in fleet["pools"]}
    assert by_pool["eagle"]["workers"] == 1 and by_pool["eagle"]["available"] == 1
    assert by_pool["eagle"]["unhealthy"] == [] and by_pool["eagle"]["open_breakers"] == []
    assert by_pool["plain"]["desired_k"] is None
    assert len(state["decisions"]) == 4 and state["decisions"][0]["pool"] == "plain"
    assert "api_key_sha256" not in response.text and hash_api_key(TENANT_KEY) not in response.text


def test_no_dataclass_of_a_compiled_module_reaches_the_state(client: TestClient) -> None:
    """The state goes to `orjson.dumps` whole, which crashes the process (a segmentation
    fault, orjson 3.13) on a dataclass that mypyc compiled: nothing in it may be one of
    the compiled modules' dataclasses, whichever build this test runs on."""
    console = client.app.state.console
    console.recent.record(record("eagle"))
    compiled = {module_name(path) for path in COMPILED}
    found: list[str] = []

    def walk(value: object) -> None:
        if is_dataclass(value):
            if type(value).__module__ in compiled:
                found.append(f"{type(value).__module__}.{type(value).__qualname__}")
            for item in fields(value):
                walk(getattr(value, item.name))
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    state = console.state()
    walk(state)
    assert state["decisions"] and not found, found


def test_a_worker_down_shows_in_the_fleet_and_the_table(client: TestClient) -> None:
    for worker in client.app.state.gateway.pools["eagle"].workers:
        worker.healthy = False
    state = admin_get(client, "/v1/console/state").json()
    eagle = next(p for p in state["fleet"][0]["pools"] if p["pool"] == "eagle")
    assert eagle["available"] == 0 and eagle["unhealthy"] == ["http://127.0.0.1:9"]
    assert {r["pool"] for r in state["routing"] if r["model"] == "m"} == {"plain"}


def basic(password: str, user: str = "admin") -> dict:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


@pytest.mark.parametrize("path", ["/console", "/v1/console/state"])
def test_the_console_takes_the_admin_key_as_bearer_or_basic(client: TestClient, path: str) -> None:
    refused = client.get(path)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Basic realm=")
    assert refused.json()["error"]["code"] == "invalid_api_key"
    for headers in ({"Authorization": f"Bearer {TENANT_KEY}"}, basic(TENANT_KEY), basic("x"),
                    {"Authorization": "Basic !!!"}):
        assert client.get(path, headers=headers).status_code == 401
    assert admin_get(client, path).status_code == 200
    assert client.get(path, headers=basic(ADMIN)).status_code == 200


def test_the_page_loads_only_its_own_assets(client: TestClient) -> None:
    page = admin_get(client, "/console")
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert 'src="/console/console.js"' in page.text and "http" not in page.text.split("<body>")[0]
    script = client.get("/console/console.js")  # code, no data: open
    assert script.status_code == 200 and "/v1/console/state" in script.text
    assert client.get("/console/console.css").status_code == 200
    missing = client.get("/console/other.js")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_without_an_admin_key_the_console_is_for_loopback_only_when_configured() -> None:
    """No admin key: loopback callers are admin only with `server.loopback_admin` (what
    `specroute up` sets); otherwise nobody is, on any address."""
    def app(loopback_admin: bool):
        return create_app(config(admin=False, loopback_admin=loopback_admin),
                          policy="learned", classify=minimal_profile)

    with TestClient(app(True)) as remote:  # served on "testserver", not a loopback address
        refused = remote.get("/v1/console/state")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
    with TestClient(app(True), base_url="http://127.0.0.1:8000") as local:
        assert local.get("/v1/console/state").status_code == 200
    with TestClient(app(False), base_url="http://127.0.0.1:8000") as local:
        refused = local.get("/v1/console/state")
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
        assert "pools" not in local.get("/ready").json()


def test_the_fleet_shows_what_redis_says_of_workers_relaunches_and_moves(redis_url: str) -> None:
    import redis

    from policies.keys import desired_k_key, fleet_move_key, pool_workers_key, worker_key
    from workers.fleet.registry import new_worker_info

    raw = {"redis_url": redis_url, "server": {"health_interval_s": 3600, "loopback_admin": True},
           "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3,
                      "model": "m", "workers": []},
                     {"name": "plain", "engine": "sglang", "method": "plain", "model": "m",
                      "workers": []}]}
    client = redis.Redis.from_url(redis_url)
    for url, k in (("http://127.0.0.1:9", 3), ("http://127.0.0.1:10", 5)):
        client.sadd(pool_workers_key("eagle"), url)
        client.set(worker_key("eagle", url),
                   new_worker_info(url, "eagle", "sglang", "eagle", k, "m", 1).to_json())
    client.set(desired_k_key("eagle"), 5)
    client.set(fleet_move_key("m"), '{"url": "http://127.0.0.1:11", "src": "plain", '
                                    '"dst": "eagle", "since": 1.0}')
    app = create_app(parse_config(raw), policy="learned", classify=minimal_profile)
    with TestClient(app, base_url="http://127.0.0.1") as local:
        console = app.state.console
        console.registry = console.read_registry()  # what its loop does every 2 s
        state = local.get("/v1/console/state").json()
    client.close()
    fleet = state["fleet"][0]
    assert fleet["moving"] == {"url": "http://127.0.0.1:11", "src": "plain", "dst": "eagle",
                               "since": 1.0}
    eagle = next(p for p in fleet["pools"] if p["pool"] == "eagle")
    assert eagle["running_k"] == {"http://127.0.0.1:9": 3, "http://127.0.0.1:10": 5}
    assert eagle["desired_k"] == 5 and eagle["relaunch"] == "k 3,5 -> 5"
    plain = next(p for p in fleet["pools"] if p["pool"] == "plain")
    assert plain["relaunch"] is None and plain["desired_k"] is None
    assert state["gateway"]["registry_error"] is None
