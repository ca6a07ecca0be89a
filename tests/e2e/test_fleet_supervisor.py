"""Supervisors following the fleet planner's desired fleet (workers/fleet/member.py):
one worker moves at a time, never below the minimum, a failed relaunch rolls back, and a
real embedded worker moves from one method to another under traffic through the real
gateway (official `openai` client) with no failed request."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port, start_process, stop_process, wait_http
from gateway_harness import start_gateway

from policies.fleet import FleetPool
from policies.keys import desired_fleet_key
from policies.planner import FleetPlan
from tests.e2e.test_supervisor import BUILTIN_TEMPLATE, FAILING_K, reported_k
from workers.models import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME


def publish(client, model: str, desired: dict[str, int]) -> None:
    client.set(desired_fleet_key(model), FleetPlan(model, {}, desired, 1.0, 1.0, 1,
                                                   "test").to_json())


def registered(client, model: str) -> dict[str, list[str]]:
    from workers.fleet.registry import list_workers

    out: dict[str, list[str]] = {}
    for info in list_workers(client):
        if info.model == model:
            out.setdefault(info.pool, []).append(info.url)
    return out


@pytest.fixture
def members(redis_url: str, tmp_path: Path):
    from workers.fleet.launch import command_builder
    from workers.fleet.member import FleetMember, MemberSettings
    from workers.fleet.supervisor import Supervisor, SupervisorSettings

    pools = {name: FleetPool(name=name, engine="sglang", method="eagle", k=k, model="m")
             for name, k in (("a", 2), ("b", 5), ("bad", FAILING_K))}
    made = []

    def make(start: str, min_workers: int = 1) -> FleetMember:
        port = free_port()
        settings = SupervisorSettings(
            url=f"http://127.0.0.1:{port}", port=port, log_path=tmp_path / f"{port}.log",
            min_relaunch_interval_s=0.0, health_timeout_s=30.0, drain_notice_s=0.0,
            drain_timeout_s=10.0, drain_grace_s=0.2, registration_ttl_s=3.0,
            stop_timeout_s=5.0)
        sup = Supervisor(pools[start], redis_url, command_builder(pools[start],
                                                                  BUILTIN_TEMPLATE), settings)
        member = FleetMember(sup, pools, lambda p: command_builder(p, BUILTIN_TEMPLATE),
                             MemberSettings(min_workers=min_workers))
        made.append(member)
        return member

    yield make
    for member in made:
        member.stop()


def test_one_worker_moves_then_a_failed_pool_rolls_back(members, redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    first, second = members("a"), members("a")
    first.start()
    second.start()
    assert registered(client, "m") == {"a": sorted([first.supervisor.settings.url,
                                                   second.supervisor.settings.url])}
    publish(client, "m", {"a": 1, "b": 1})
    outcomes = [first.poll_once(), second.poll_once()]
    assert sorted(outcomes) == ["idle", "moved"]  # the second sees the fleet as desired
    mover = first if outcomes[0] == "moved" else second
    assert mover.supervisor.pool.name == "b" and reported_k(mover.supervisor.settings.url) == 5
    assert {p: len(u) for p, u in registered(client, "m").items()} == {"a": 1, "b": 1}

    publish(client, "m", {"a": 1, "bad": 1})  # the b worker's next pool cannot start
    assert mover.poll_once() == "failed"
    assert mover.supervisor.pool.name == "b" and reported_k(mover.supervisor.settings.url) == 5
    assert {p: len(u) for p, u in registered(client, "m").items()} == {"a": 1, "b": 1}


def test_never_below_the_minimum(members, redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    only = members("a", min_workers=1)
    only.start()
    publish(client, "m", {"a": 0, "b": 1})
    assert only.poll_once() == "held"
    assert only.supervisor.pool.name == "a"


def test_start_takes_the_desired_fleets_shortfall(members, redis_url: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    publish(client, "m", {"a": 0, "b": 1})
    member = members("a")
    member.start()
    assert member.supervisor.pool.name == "b" and member.moves == 0
    assert registered(client, "m") == {"b": [member.supervisor.settings.url]}


def test_stop_with_drain_finishes_requests_in_flight(members) -> None:
    """SIGTERM (Kubernetes scaling a pool down): requests in flight finish first."""
    from tests.e2e.test_supervisor import wait_in_flight

    member = members("a")
    member.start()
    url = member.supervisor.settings.url
    done: dict[str, int] = {}

    def slow() -> None:
        done["status"] = httpx.post(f"{url}/generate", json={"sleep": 1.0},
                                    timeout=10).status_code

    thread = threading.Thread(target=slow)
    thread.start()
    wait_in_flight(url)
    member.stop(drain=True)
    thread.join(10)
    assert done == {"status": 200}


WORKER = ("{python} -m specroute.cli worker --method {method} --port {port} "
          "--num-speculative-tokens {k} --model {model} --threads 1")


def test_embedded_worker_moves_method_under_traffic(redis_url: str, tmp_path: Path) -> None:
    """Two supervised embedded workers (tiny bundled model) in the plain pool behind the
    real gateway; the desired fleet asks for one n-gram worker; one drains, relaunches with
    method ngram, registers in the n-gram pool, and serves there, while an `openai` client
    keeps sending requests through the gateway: none fails."""
    import openai
    import redis

    model = BUNDLED_MODEL_NAME
    config = {"redis_url": redis_url,
              "server": {"discovery_interval_s": 0.5, "health_interval_s": 0.5},
              # the gateway's own plans every 10 refits (300 s): the test's plan stands
              "policy": {"refit_interval_s": 30.0},
              "pools": [{"name": "tiny-plain", "engine": "embedded", "method": "plain", "k": 0,
                         "model": model, "model_path": str(BUNDLED_MODEL_DIR), "workers": []},
                        {"name": "tiny-ngram", "engine": "embedded", "method": "ngram", "k": 4,
                         "model": model, "model_path": str(BUNDLED_MODEL_DIR), "workers": []}]}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(config))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    procs = []
    try:
        for i in range(2):
            procs.append(start_process(
                ["-m", "specroute.cli", "supervise", "--config", str(path), "--pool",
                 "tiny-plain", "--port", str(free_port()), "--follow-fleet",
                 "--command", WORKER], tmp_path / f"supervisor-{i}.log"))
        deadline = time.monotonic() + 120
        while len(registered(client, model).get("tiny-plain", [])) < 2:
            assert time.monotonic() < deadline, "supervised workers never registered"
            time.sleep(0.2)
        gateway_proc, gateway = start_gateway(tmp_path, config, policy="learned")
        procs.append(gateway_proc)
        wait_http(gateway + "/ready", 30, gateway_proc)
        fleet = httpx.get(gateway + "/v1/routing/fleet", timeout=30).json()
        assert fleet["planner"] == "on"
        assert fleet["models"][model]["current"] == {"tiny-plain": 2, "tiny-ngram": 0}

        sent, failures = [0], []
        stop = threading.Event()

        def traffic() -> None:
            api = openai.OpenAI(base_url=gateway + "/v1", api_key="none", max_retries=0)
            while not stop.is_set():
                try:
                    out = api.completions.create(model=model, prompt="def add(a, b):",
                                                 max_tokens=12, temperature=0)
                    assert out.choices[0].text is not None
                    sent[0] += 1
                except Exception as exc:  # noqa: BLE001 - every failure is the finding
                    failures.append(repr(exc))

        thread = threading.Thread(target=traffic)
        thread.start()
        try:
            publish(client, model, {"tiny-plain": 1, "tiny-ngram": 1})
            deadline = time.monotonic() + 180
            while not registered(client, model).get("tiny-ngram"):
                assert time.monotonic() < deadline, "no worker moved to the n-gram pool"
                time.sleep(0.2)
            [moved] = registered(client, model)["tiny-ngram"]
            wait_http(moved + "/health", 60)
            served = sent[0]
            deadline = time.monotonic() + 60
            while sent[0] < served + 10:  # traffic keeps flowing after the move
                assert time.monotonic() < deadline, "traffic stalled after the move"
                time.sleep(0.1)
        finally:
            stop.set()
            thread.join(60)
        assert failures == []
        assert len(registered(client, model)["tiny-plain"]) == 1
        info = httpx.get(moved + "/server_info", timeout=5).json()
        assert info["speculative_algorithm"] == "NGRAM"
    finally:
        for proc in reversed(procs):
            stop_process(proc)
