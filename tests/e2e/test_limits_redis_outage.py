"""Rate-limit counts are never dropped on a Redis error without a word (issue 43), with a
real Redis that is stopped and started again: each failed call is counted, the counts
made meanwhile are kept in the process and added to Redis when it answers, the outage's
start and end are warnings, and `/metrics` shows all of it. Before, a failed spend was
lost from the shared count and said so once per `retry_s` at most, with no metric."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import httpx
import pytest
import redis
from conftest import free_port, start_redis, stop_process, wait_until
from gateway_harness import gateway_over, start_stubs
from prometheus_client import CollectorRegistry, generate_latest

from gateway.config import TenantConfig, hash_api_key
from gateway.tenants.limits import WINDOW_S, Limits, LimitsCollector
from policies.keys import limit_window_keys

TENANT = TenantConfig(name="t", rate_limit_rpm=100, rate_limit_tpm=10_000)


def counted(url: str, tenant: str, window: int) -> tuple[int, int]:
    client = redis.Redis.from_url(url)
    try:
        requests, tokens = (int(client.get(key) or 0)
                            for key in limit_window_keys(tenant, window))
    finally:
        client.close()
    return requests, tokens


async def test_counts_made_while_redis_is_down_are_reported_and_replayed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    now = [WINDOW_S * 1000.0 + 1]
    window = int(now[0] // WINDOW_S)
    server = start_redis(port, tmp_path)
    limits = Limits(url, clock=lambda: now[0], retry_s=0.2, timeout_s=0.3)
    registry = CollectorRegistry()
    registry.register(LimitsCollector(limits))
    try:
        await limits.admit(TENANT)
        limits.spend(TENANT, 30)
        await asyncio.gather(*limits.pending)
        assert counted(url, "t", window) == (1, 30)
        stop_process(server)  # Redis goes away
        caplog.set_level(logging.WARNING, logger="specroute.gateway")
        await limits.admit(TENANT)  # fails open: counted here, kept for Redis
        limits.spend(TENANT, 40)  # Redis marked down: kept without asking it
        await asyncio.gather(*limits.pending)
        assert limits.errors["admit"] == 1
        assert limits.kept == {"requests": 1, "tokens": 40}
        assert "rate-limit Redis unavailable (ConnectionError on admit)" in caplog.text
        metrics = generate_latest(registry).decode()
        assert 'specroute_rate_limit_redis_errors_total{operation="admit"} 1.0' in metrics
        assert 'specroute_rate_limit_kept_local_total{kind="tokens"} 40.0' in metrics
        server = start_redis(port, tmp_path)  # back, empty (no persistence)
        await asyncio.sleep(0.3)  # past retry_s
        await limits.admit(TENANT)
        await asyncio.gather(*limits.pending)
        await asyncio.gather(*limits.pending)  # the replay the admit started
        assert counted(url, "t", window) == (2, 40)  # this admit + the one kept
        assert "replayed 1 requests and 40 tokens" in caplog.text
    finally:
        await limits.close()
        stop_process(server)


async def test_counts_whose_window_is_over_are_dropped_and_said(tmp_path: Path) -> None:
    port = free_port()
    now = [WINDOW_S * 1000.0 + 1]
    limits = Limits(f"redis://127.0.0.1:{port}/0", clock=lambda: now[0], retry_s=0.1,
                    timeout_s=0.3)
    try:
        limits.spend(TENANT, 25)  # nothing listens yet
        await asyncio.gather(*limits.pending)
        assert limits.errors["spend"] == 1 and limits.kept["tokens"] == 25
        server = start_redis(port, tmp_path)
        now[0] += 3 * WINDOW_S
        await asyncio.sleep(0.2)
        await limits.admit(TENANT)
        await asyncio.gather(*limits.pending)
        await asyncio.gather(*limits.pending)
        assert limits.dropped == {"requests": 0, "tokens": 25}
    finally:
        await limits.close()
        stop_process(server)


def test_the_gateway_reports_a_stopped_redis(tmp_path: Path) -> None:
    """End to end: the gateway keeps serving a limited tenant while its Redis is
    stopped; `/metrics` and its log say what happened; the count reaches Redis later."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    server = start_redis(port, tmp_path)
    procs, urls = start_stubs(tmp_path, {"w": ["--model", "m", "--method", "plain",
                                               "--k", "0"]})
    config = {"redis_url": url,
              "pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": [urls["w"]]}],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key("sk-acme")],
                           "rate_limit_rpm": 100}]}
    body = {"model": "m", "prompt": "alpha beta", "max_tokens": 2}
    headers = {"Authorization": "Bearer sk-acme"}
    try:
        with gateway_over(tmp_path, config, procs) as gateway:
            assert httpx.post(gateway + "/v1/completions", json=body, headers=headers,
                              timeout=30).status_code == 200
            stop_process(server)
            answer = httpx.post(gateway + "/v1/completions", json=body, headers=headers,
                                timeout=30)
            assert answer.status_code == 200, answer.text  # fails open
            window = int(time.time() // WINDOW_S)
            metrics = httpx.get(gateway + "/metrics", timeout=5).text
            assert 'specroute_rate_limit_redis_errors_total{operation="admit"} 1.0' in metrics
            assert 'specroute_rate_limit_kept_local_total{kind="requests"} 1.0' in metrics
            log = (tmp_path / "gw.log").read_text()
            assert "rate-limit Redis unavailable" in log
            server = start_redis(port, tmp_path)
            time.sleep(2.5)  # past the limiter's retry_s (2 s)
            assert httpx.post(gateway + "/v1/completions", json=body, headers=headers,
                              timeout=30).status_code == 200
            if int(time.time() // WINDOW_S) == window:  # else the window turned meanwhile
                wait_until(lambda: counted(url, "acme", window)[0] == 2, 5,
                           "the kept request replayed")
            wait_until(lambda: "rate-limit Redis answers again" in
                       (tmp_path / "gw.log").read_text(), 5, "the recovery logged")
    finally:
        stop_process(server)
