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
from gateway.errors import NoHealthyWorker, UpstreamUnavailable
from gateway.pools import BreakerState, CircuitBreaker, Worker, build_pools
from gateway.schemas import parse_request
from gateway.upstream.health import HealthMonitor, Probe, apply_probe
from gateway.upstream.http1 import Http1Client
from tests.gateway.upstream.test_gateway_dispatch import make_gateway, pool


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
    apply_probe(worker, Probe.OK, server)
    assert worker.healthy  # the first answer counts as is
    for expected in (True, True, False):
        apply_probe(worker, Probe.FAILED, server)
        assert worker.healthy is expected
    for expected in (False, True):
        apply_probe(worker, Probe.OK, server)
        assert worker.healthy is expected
    apply_probe(worker, Probe.FAILED, server)
    apply_probe(worker, Probe.OK, server)  # a miss between good probes resets the count
    assert worker.healthy and worker.probe_failures == 0


def test_a_probe_timeout_spares_a_worker_that_is_serving() -> None:
    server = ServerConfig(health_interval_s=0.5, unhealthy_after=3)  # probe timeout 2 s
    worker = Worker("http://w:1", CircuitBreaker(3, 10))
    apply_probe(worker, Probe.OK, server, now=0.0)
    worker.served(now=10.0)
    for now in (10.5, 12.0, 14.0, 16.0):  # within 3 x 2 s of the last answered request
        apply_probe(worker, Probe.TIMED_OUT, server, now=now)
    assert worker.healthy and worker.probe_failures == 0
    apply_probe(worker, Probe.FAILED, server, now=16.0)  # a refusal always counts
    assert worker.probe_failures == 1
    for now in (16.5, 17.0):  # no answer since 10.0: timeouts count again
        apply_probe(worker, Probe.TIMED_OUT, server, now=now)
    assert not worker.healthy


def test_a_pool_whose_probes_all_time_out_falls_back_on_its_last_resort() -> None:
    config = parse_config({"pools": [pool("p", ["http://a:1", "http://b:1", "http://c:1"])],
                           "server": {"unhealthy_after": 1}})
    p = build_pools(config)["p"]
    a, b, c = p.workers
    for worker, probe in ((a, Probe.OK), (b, Probe.TIMED_OUT), (c, Probe.FAILED)):
        apply_probe(worker, probe, config.server)
    assert (p.healthy_workers, p.pick(), p.in_panic(time.monotonic())) == (1, a, False)
    apply_probe(a, Probe.TIMED_OUT, config.server)  # nothing available: the last resort
    assert not a.healthy and p.healthy_workers == 2 and p.in_panic(time.monotonic())
    assert p.pick({a.url}) is b and p.pick() in (a, b)
    b.breaker.failure(time.monotonic(), hard=True)  # a failing worker is no resort
    a.draining = True
    assert p.healthy_workers == 0 and p.pick() is None  # c refused: never a resort
    apply_probe(c, Probe.OK, config.server)
    apply_probe(c, Probe.OK, config.server)
    assert p.pick() is c and not p.in_panic(time.monotonic())


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        yield s


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


async def test_a_busy_worker_that_serves_stays_in_while_a_silent_one_goes(
        http1_client: Http1Client, session: aiohttp.ClientSession) -> None:
    """/health stalls past the probe timeout on both workers (a server starved of CPU):
    the one that keeps answering requests through the gateway stays available."""
    busy_cfg, silent_cfg = StubConfig(model="m"), StubConfig(model="m")
    busy, busy_url = await serve(StubServer(busy_cfg).app())
    silent, silent_url = await serve(StubServer(silent_cfg).app())
    try:
        gateway = make_gateway(http1_client, [pool("busy", [busy_url]), pool("silent", [silent_url])])
        server = ServerConfig(health_interval_s=0.2, unhealthy_after=2)  # probe timeout 2 s
        monitor = HealthMonitor(gateway.pools, session, server)
        await monitor.probe_all()
        busy_cfg.health_stall_s = silent_cfg.health_stall_s = 3.0
        request = parse_request({"model": "m", "prompt": "x y"}, "completions")
        for _ in range(3):
            decision, pools = gateway.router.route(request, gateway.classify(
                request, "t"))
            lease, result = await gateway.dispatcher.generate(request, decision, [
                gateway.pools["busy"]])
            lease.release()
            assert lease.worker.url == busy_url and result.text == "x y"
            await monitor.probe_all()
        assert gateway.pools["busy"].workers[0].healthy
        assert not gateway.pools["silent"].workers[0].healthy
    finally:
        await busy.close()
        await silent.close()


async def test_a_worker_slow_to_probe_still_serves_when_it_is_the_only_one(
        http1_client: Http1Client, session: aiohttp.ClientSession) -> None:
    """Its /health stalls past the probe timeout and nothing else serves the model: the
    request is answered, not refused with a 503; once its server is gone, it is."""
    cfg = StubConfig(model="m")
    stub, url = await serve(StubServer(cfg).app())
    gateway = make_gateway(http1_client, [pool("only", [url])])
    monitor = HealthMonitor(gateway.pools, session, ServerConfig(unhealthy_after=1))
    await monitor.probe_all()
    cfg.health_stall_s = 3.0
    await monitor.probe_all()
    worker = gateway.pools["only"].workers[0]
    assert not worker.healthy and worker.timed_out
    request = parse_request({"model": "m", "prompt": "x y"}, "completions")
    decision, pools = gateway.router.route(request, gateway.classify(request, "t"))
    lease, result = await gateway.dispatcher.generate(request, decision, pools)
    lease.release()
    assert result.text == "x y" and lease.worker is worker
    await stub.close()
    await monitor.probe_all()  # refused now
    assert not worker.timed_out and gateway.pools["only"].healthy_workers == 0
    with pytest.raises(NoHealthyWorker):
        gateway.router.route(request, gateway.classify(request, "t"))


async def test_failing_worker_is_skipped_once_its_breaker_opens(http1_client: Http1Client) -> None:
    failing_cfg, good_cfg = StubConfig(model="m", fail_after=0), StubConfig(model="m")
    bad, bad_url = await serve(StubServer(failing_cfg).app())
    good, good_url = await serve(StubServer(good_cfg).app())
    try:
        gateway = make_gateway(http1_client, [pool("p", [bad_url, good_url])])
        request = parse_request({"model": "m", "prompt": "x y"}, "completions")
        for _ in range(4):
            decision, pools = gateway.router.route(request, gateway.classify(
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


async def test_a_full_worker_503_is_retried_elsewhere_and_spares_its_breaker(
        http1_client: Http1Client) -> None:
    """A worker's own 503 (its queue is full) is load, not a fault: the request goes on to
    another worker, and a busy pool's breakers stay closed however often it happens."""
    calls = []

    async def full(request: web.Request) -> web.Response:
        calls.append(request.path)
        return web.json_response({"error": {"message": "queue full"}}, status=503)

    app = web.Application()
    app.router.add_post("/generate", full)
    busy, busy_url = await serve(app)
    good, good_url = await serve(StubServer(StubConfig(model="m")).app())
    try:
        gateway = make_gateway(http1_client, [pool("p", [busy_url, good_url])])
        request = parse_request({"model": "m", "prompt": "x y"}, "completions")
        for _ in range(5):
            decision, pools = gateway.router.route(request, gateway.classify(request, "t"))
            lease, _ = await gateway.dispatcher.generate(request, decision, pools)
            assert lease.worker.url == good_url
        breaker = gateway.pools["p"].workers[0].breaker
        assert len(calls) == 5  # tried every time: never taken out
        assert breaker.state(time.monotonic()) is BreakerState.CLOSED and breaker.failures == 0
    finally:
        await busy.close()
        await good.close()


async def test_all_attempts_fail_with_the_last_error(http1_client: Http1Client) -> None:
    bad, url = await serve(StubServer(StubConfig(model="m", fail_after=0)).app())
    try:
        gateway = make_gateway(http1_client, [pool("p", [url])])
        request = parse_request({"model": "m", "prompt": "x"}, "completions")
        decision, pools = gateway.router.route(request, gateway.classify(
            request, "t"))
        with pytest.raises(UpstreamUnavailable, match="answered 500"):
            await gateway.dispatcher.generate(request, decision, pools)
    finally:
        await bad.close()
