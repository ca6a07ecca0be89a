"""Circuit breaker and probe hysteresis: the state machines, then against real HTTP."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from openai_stub import VLLMStub
from sglang_stub import StubConfig, StubServer

from gateway.config import ServerConfig, parse_config
from gateway.errors import UpstreamUnavailable
from gateway.pools import BreakerState, CircuitBreaker, Worker, build_pools
from gateway.schemas import parse_request
from gateway.upstream.health import HealthMonitor, apply_probe
from gateway.upstream.http1 import Http1Client
from tests.gateway.test_gateway_dispatch import make_gateway, pool


def test_breaker_opens_cools_down_and_lets_one_trial_through() -> None:
    breaker = CircuitBreaker(failures_to_open=3, cooldown_s=10)
    for _ in range(2):
        breaker.failure(0.0)
    assert breaker.state(0.0) is BreakerState.CLOSED and breaker.allows(0.0)
    breaker.failure(1.0)
    assert breaker.state(5.0) is BreakerState.OPEN and not breaker.allows(5.0)
    assert breaker.state(11.0) is BreakerState.HALF_OPEN and breaker.allows(11.0)
    breaker.begin(11.0)
    assert not breaker.allows(11.5)  # one trial at a time
    breaker.failure(12.0)  # the trial failed: open again, a new cooldown
    assert breaker.state(21.0) is BreakerState.OPEN and breaker.allows(22.0)
    breaker.begin(22.0)
    breaker.success()
    assert breaker.state(22.0) is BreakerState.CLOSED and breaker.failures == 0
    breaker.failure(30.0, hard=True)  # connection refused opens at once
    assert breaker.state(30.0) is BreakerState.OPEN


def test_probe_hysteresis() -> None:
    server = ServerConfig(unhealthy_after=3, healthy_after=2)
    worker = Worker("http://w:1", CircuitBreaker(3, 10))
    apply_probe(worker, True, server)
    assert worker.healthy  # the first answer counts as is
    for expected in (True, True, False):
        apply_probe(worker, False, server)
        assert worker.healthy is expected
    for expected in (False, True):
        apply_probe(worker, True, server)
        assert worker.healthy is expected
    apply_probe(worker, False, server)
    apply_probe(worker, True, server)  # a miss between good probes resets the count
    assert worker.healthy and worker.probe_failures == 0


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        yield s


@pytest.fixture
async def client() -> AsyncIterator[Http1Client]:
    upstream = Http1Client(connect_s=5, read_s=5, total_s=5)
    yield upstream
    upstream.close()


async def serve(app: web.Application) -> tuple[TestServer, str]:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, str(server.make_url("")).rstrip("/")


async def test_openai_pools_fall_back_to_v1_models(session: aiohttp.ClientSession) -> None:
    no_health = web.Application()  # an OpenAI-compatible server without /health
    no_health.router.add_get("/v1/models", VLLMStub(StubConfig(model="m")).models)
    server, url = await serve(no_health)
    try:
        config = parse_config({"pools": [pool("v", [url], engine="vllm"),
                                         pool("s", [url], engine="sglang")]})
        pools = build_pools(config)
        monitor = HealthMonitor(pools, session, config.server)
        await monitor.probe_all()
        assert pools["v"].workers[0].healthy  # /health 404, /v1/models 200
        assert not pools["s"].workers[0].healthy  # SGLang must answer /health
    finally:
        await server.close()


async def test_failing_worker_is_skipped_once_its_breaker_opens(client: Http1Client) -> None:
    failing_cfg, good_cfg = StubConfig(model="m", fail_after=0), StubConfig(model="m")
    bad, bad_url = await serve(StubServer(failing_cfg).app())
    good, good_url = await serve(StubServer(good_cfg).app())
    try:
        gateway = make_gateway(client, [pool("p", [bad_url, good_url])])
        request = parse_request({"model": "m", "prompt": "x y"}, "completions")
        for _ in range(4):
            decision, pools = gateway.router.route(request, gateway.router.classify(
                request, "t"))
            lease, result = await gateway.dispatcher.generate(request, decision, pools)
            assert lease.worker.url == good_url and result.text == "x y"
        assert failing_cfg.generate_calls == 3  # the 4th request skipped it: breaker open
        breaker = gateway.pools["p"].workers[0].breaker
        assert breaker.state(time.monotonic()) is BreakerState.OPEN
        assert good_cfg.generate_calls == 4
    finally:
        await bad.close()
        await good.close()


async def test_all_attempts_fail_with_the_last_error(client: Http1Client) -> None:
    bad, url = await serve(StubServer(StubConfig(model="m", fail_after=0)).app())
    try:
        gateway = make_gateway(client, [pool("p", [url])])
        request = parse_request({"model": "m", "prompt": "x"}, "completions")
        decision, pools = gateway.router.route(request, gateway.router.classify(
            request, "t"))
        with pytest.raises(UpstreamUnavailable, match="answered 500"):
            await gateway.dispatcher.generate(request, decision, pools)
    finally:
        await bad.close()
