"""Who the registry may name: a real Redis, stub workers registered the way
`workers.fleet.registry` does it, and a real gateway whose pool admits registered URLs on
127.0.0.1 only and takes only entries signed with the fleet's secret. A rogue entry (any
process with write access to Redis: outside the allowlist, unsigned, or signed with
another secret) never gets a request; the signed one inside gets them all."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import free_port, start_process, stop_process, wait_http
from gateway_harness import start_gateway, start_stubs, stats, worker_states

from gateway.config import ConfigError, parse_config
from gateway.upstream.discovery import url_allowed
from workers.fleet.registry import Registration, new_worker_info, signed_by, worker_key

SECRET = "fleet-shared-secret"


@pytest.fixture
def fleet(tmp_path: Path, redis_url: str) -> Iterator[dict]:
    stub = ["--model", "m", "--method", "plain"]
    procs, urls = start_stubs(tmp_path, {"legit": stub, "unsigned": stub, "forged": stub})
    port = free_port()  # outside the allowlist: 127.0.0.2, still this machine's loopback
    procs["outside"] = start_process(["tests/sglang_stub.py", "--port", str(port), "--host",
                                      "127.0.0.2", *stub], tmp_path / "outside.log")
    urls["outside"] = f"http://127.0.0.2:{port}"
    registrations: list[Registration] = []
    try:
        wait_http(urls["outside"] + "/health", 20, procs["outside"])
        config = {"redis_url": redis_url,
                  "server": {"health_interval_s": 0.2, "discovery_interval_s": 0.1,
                             "registry_secret": SECRET},
                  "pools": [{"name": "p", "engine": "sglang", "model": "m", "workers": [],
                             "registry_allow": ["127.0.0.1/32"]}]}
        procs["gw"], gateway = start_gateway(tmp_path, config)
        for name, secret in (("legit", SECRET), ("outside", SECRET), ("unsigned", ""),
                             ("forged", "another-secret")):
            info = new_worker_info(urls[name], "p", "sglang", "plain", 0, "m", pid=1)
            registrations.append(Registration(redis_url, info, ttl=5.0, secret=secret).start())
        yield {"gateway": gateway, "urls": urls, "log": tmp_path / "gateway.log"}
    finally:
        for registration in registrations:
            registration.stop()
        for proc in procs.values():
            stop_process(proc)


def test_rogue_entries_never_get_traffic(fleet: dict, redis_url: str) -> None:
    gateway, urls = fleet["gateway"], fleet["urls"]
    deadline = time.monotonic() + 10
    while httpx.get(gateway + "/ready").status_code != 200:
        assert time.monotonic() < deadline, "the signed worker inside was never taken"
        time.sleep(0.1)
    time.sleep(0.5)  # several discovery rounds: every entry has been read
    assert [s["url"] for s in worker_states(gateway, "p")] == [urls["legit"]]
    for _ in range(6):
        response = httpx.post(gateway + "/v1/completions", json={"model": "m", "prompt": "a"},
                              timeout=5)
        assert response.status_code == 200, response.text
    calls = {name: stats(url)["generate_calls"] for name, url in urls.items()}
    assert calls == {"legit": 6, "outside": 0, "unsigned": 0, "forged": 0}
    log = fleet["log"].read_text()
    assert "is outside the pool's registry_allow; ignored" in log
    assert log.count("is not signed with the registry secret; ignored") == 2
    client = redis.Redis.from_url(redis_url)
    assert signed_by(client.get(worker_key("p", urls["legit"])), SECRET)
    assert not signed_by(client.get(worker_key("p", urls["unsigned"])), SECRET)


def test_allow_entries() -> None:
    allow = ("10.0.0.0/8", "sglang-*", "*.svc.cluster.local")
    assert url_allowed("http://10.1.2.3:30000", allow)
    assert url_allowed("http://sglang-plain:30000", allow)
    assert url_allowed("http://w.specroute.svc.cluster.local:30000", allow)
    assert not url_allowed("http://11.0.0.1:30000", allow)
    assert not url_allowed("http://evil:30000", allow)
    assert not url_allowed("http://10.evil.com:30000", allow)
    pool = {"name": "p", "engine": "sglang", "model": "m", "workers": ["http://a:1"]}
    with pytest.raises(ConfigError, match=r"pools\[0\].registry_allow\[0\]: not a CIDR"):
        parse_config({"pools": [{**pool, "registry_allow": ["10.0.0.0/33"]}]})
