"""Worker discovery from the Redis registry: a real Redis, real stub workers registered
the way `workers.fleet.registry` does it, and a real gateway process."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import free_port, stop_process
from gateway_harness import start_gateway, start_stubs, stats, worker_states

from gateway.config import ConfigError, parse_config
from gateway.pools import build_pools
from gateway.upstream.discovery import RegistryDiscovery
from workers.fleet.registry import Registration, new_worker_info, set_draining


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.05)


def register(redis_url: str, pool: str, url: str, model: str) -> Registration:
    info = new_worker_info(url, pool, "sglang", "plain", 0, model, pid=1)
    return Registration(redis_url, info, ttl=3.0).start()


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str) -> Iterator[dict]:
    procs: list = []
    try:
        started, urls = start_stubs(tmp_path, dict.fromkeys(
            ("static", "registered", "discovered"), ["--model", "m", "--method", "plain"]))
        procs.extend(started.values())
        config = {"redis_url": redis_url,
                  "server": {"health_interval_s": 0.2, "discovery_interval_s": 0.1},
                  "pools": [{"name": "p", "engine": "sglang", "model": "m",
                             "workers": [urls["static"]]},
                            {"name": "q", "engine": "sglang", "model": "mq", "workers": []}]}
        proc, gateway = start_gateway(tmp_path, config)
        procs.append(proc)
        yield {"gateway": gateway, "urls": urls, "redis": redis_url, "log": tmp_path}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def served_by(fleet: dict, model: str, n: int) -> dict[str, int]:
    before = {name: stats(url)["generate_calls"] for name, url in fleet["urls"].items()}
    for _ in range(n):
        response = httpx.post(fleet["gateway"] + "/v1/completions",
                              json={"model": model, "prompt": "a b"}, timeout=5)
        assert response.status_code == 200, response.text
    return {name: stats(url)["generate_calls"] - before[name]
            for name, url in fleet["urls"].items()}


def test_registered_worker_joins_its_pool_and_leaves_when_gone(fleet: dict) -> None:
    gateway = fleet["gateway"]
    assert httpx.post(gateway + "/v1/completions",
                      json={"model": "mq", "prompt": "x"}).status_code == 503
    registration = register(fleet["redis"], "q", fleet["urls"]["discovered"], "mq")
    def mq_ready() -> bool:
        return httpx.get(gateway + "/ready").json()["models_ready"]["mq"]

    wait_for(mq_ready)
    (state,) = worker_states(gateway, "q")
    assert state["discovered"] and state["url"] == fleet["urls"]["discovered"]
    assert served_by(fleet, "mq", 2)["discovered"] == 2
    registration.stop()  # deregisters at once
    wait_for(lambda: worker_states(gateway, "q") == [])
    assert not mq_ready()  # the replica stays ready for model m, not for mq


def test_draining_worker_gets_no_new_requests(fleet: dict) -> None:
    gateway, urls = fleet["gateway"], fleet["urls"]
    registration = register(fleet["redis"], "p", urls["registered"], "m")
    try:
        wait_for(lambda: len([s for s in worker_states(gateway, "p") if s["healthy"]]) == 2)
        client = redis.Redis.from_url(fleet["redis"])
        set_draining(client, "p", urls["static"], True)  # a configured worker drains too
        wait_for(lambda: any(s["draining"] for s in worker_states(gateway, "p")))
        assert served_by(fleet, "m", 4) == {"static": 0, "registered": 4, "discovered": 0}
        set_draining(client, "p", urls["static"], False)
        wait_for(lambda: not any(s["draining"] for s in worker_states(gateway, "p")))
        assert served_by(fleet, "m", 4)["static"] > 0
        client.close()
    finally:
        registration.stop()
    assert "Traceback" not in (fleet["log"] / "gateway.log").read_text()


async def test_redis_down_keeps_the_last_known_workers(redis_url: str) -> None:
    config = parse_config({"redis_url": redis_url, "pools": [
        {"name": "q", "engine": "sglang", "model": "mq", "workers": []}]})
    pools = build_pools(config)
    registration = register(redis_url, "q", "http://127.0.0.1:9", "mq")
    discovery = RegistryDiscovery(pools, redis_url, interval_s=0.5)
    try:
        await discovery.sync()
        assert [w.url for w in pools["q"].workers] == ["http://127.0.0.1:9"]
        await discovery.client.aclose()
        dead = RegistryDiscovery(pools, f"redis://127.0.0.1:{free_port()}/0", interval_s=0.5)
        started = time.monotonic()
        await dead.sync()
        assert time.monotonic() - started < 1.5  # bounded, never hangs
        assert [w.url for w in pools["q"].workers] == ["http://127.0.0.1:9"]
        assert dead.syncs == 0
        await dead.stop()
    finally:
        registration.stop()


def test_empty_worker_list_needs_redis() -> None:
    pools = [{"name": "q", "engine": "sglang", "model": "m", "workers": []}]
    with pytest.raises(ConfigError, match=r"pools\[0\]\.workers.*redis_url"):
        parse_config({"pools": pools})
    assert parse_config({"pools": pools, "redis_url": "redis://x:1/0"}).pools[0].workers == ()
