"""Tenants' SLOs steer the learned policy's decisions under load, through the real gateway:
with a latency tenant's work holding the EAGLE pool, the same body from a batch tenant is
sent elsewhere at less fleet cost while the latency tenant keeps speculation, and
`/v1/routing/explain` says why. The metrics scrape parses with prometheus_client."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from conftest import stop_process
from gateway_harness import start_gateway, start_stubs
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import hash_api_key

LATENCY, BATCH = "sk-test-latency", "sk-test-batch"
BODY = {"model": "m", "messages": [{"role": "user", "content": "tell me a story"}],
        "max_tokens": 16, "temperature": 0}


def explain(url: str, key: str) -> dict:
    response = httpx.post(url + "/v1/routing/explain", json=BODY, timeout=10,
                          headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_latency_and_batch_tenants_get_different_decisions_under_load(tmp_path: Path) -> None:
    procs, urls = start_stubs(tmp_path, {
        "eagle": ["--model", "m", "--method", "eagle", "--k", "3", "--stall", "60"],
        "plain": ["--model", "m", "--method", "plain", "--k", "0", "--stall", "60"]})
    config = {
        "server": {"health_interval_s": 0.5},
        "admission": {"max_inflight_per_worker": 1},
        "pools": [
            {"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3, "model": "m",
             "workers": [urls["eagle"]]},
            {"name": "plain", "engine": "sglang", "method": "plain", "k": 0, "model": "m",
             "workers": [urls["plain"]]}],
        "tenants": [
            {"name": "latency", "api_key_sha256": [hash_api_key(LATENCY)], "priority": 10,
             "slo_ttft_ms": 5000, "slo_tpot_ms": 5000, "may_pin": True},
            {"name": "batch", "api_key_sha256": [hash_api_key(BATCH)], "priority": 0,
             "slo_ttft_ms": 60000, "slo_tpot_ms": 5000}]}
    gateway_proc, url = start_gateway(tmp_path, config, policy="learned")
    clients: list[httpx.Client] = []
    try:
        deadline = time.monotonic() + 20
        while httpx.get(url + "/ready", timeout=2).status_code != 200:
            assert time.monotonic() < deadline, "workers never became ready"
            time.sleep(0.1)
        idle = explain(url, BATCH)
        assert "no pool busy" in idle["decision"]["reason"]
        chosen = explain(url, LATENCY)["decision"]
        assert chosen["k"] > 0, chosen  # the policy speculates for this body when idle

        def hold(pool: str) -> None:  # a latency request that the stalled worker holds
            client = httpx.Client(timeout=90)
            clients.append(client)
            try:
                client.post(url + "/v1/completions", json={"model": "m", "prompt": "x",
                                                          "max_tokens": 4},
                            headers={"Authorization": f"Bearer {LATENCY}",
                                     "x-specroute-pool": pool})
            except httpx.HTTPError:
                pass  # closed at the end of the test

        for _ in range(2):  # one running, one queued: the pool is busy
            threading.Thread(target=hold, args=(chosen["pool"],), daemon=True).start()
        deadline = time.monotonic() + 20
        while True:
            busy = explain(url, BATCH)
            if "yields" in busy["decision"]["reason"]:
                break
            assert time.monotonic() < deadline, busy
            time.sleep(0.1)
        latency = explain(url, LATENCY)
        assert busy["tenant"] == {"name": "batch", "priority": 0, "slo_ttft_ms": 60000.0,
                                  "slo_tpot_ms": 5000.0}
        assert (busy["decision"]["pool"], busy["decision"]["k"]) == ("plain", 0)
        assert latency["decision"]["pool"] == chosen["pool"] and latency["decision"]["k"] > 0
        assert "yields" not in latency["decision"]["reason"]
        assert "slo latency" in latency["decision"]["reason"]
        scrape = httpx.get(url + "/metrics", timeout=5).text
        families = {f.name: f for f in text_string_to_metric_families(scrape)}
        depth = {s.labels["pool"]: s.value for s in families["specroute_queue_depth"].samples}
        assert depth[chosen["pool"]] == 1
        for name in ("specroute_tenant_requests", "specroute_tenant_slo_attainment",
                     "specroute_queue_wait_seconds", "specroute_shed",
                     "specroute_rate_limited", "specroute_decisions",
                     "specroute_tenant_ttft_seconds"):
            assert name in families, name
    finally:
        for client in clients:
            client.close()
        stop_process(gateway_proc)
        for proc in procs.values():
            stop_process(proc)
