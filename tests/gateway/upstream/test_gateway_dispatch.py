"""Adapters, routing and failover against in-process stub servers over real HTTP."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from conftest import free_port
from openai_stub import VLLMStub
from sglang_stub import StubConfig, StubServer

from gateway.classifier.minimal import minimal_profile
from gateway.config import hash_api_key, parse_config
from gateway.errors import (
    AuthenticationFailed,
    InvalidRequest,
    ModelNotFound,
    NoHealthyWorker,
    RateLimited,
    UpstreamUnavailable,
)
from gateway.http.gateway import Gateway
from gateway.pools import BreakerState, build_pools
from gateway.routing.router import PoolRouter
from gateway.schemas import parse_request
from gateway.telemetry.record import Outcome, Reporter, Timer
from gateway.telemetry.spans import make_tracer
from gateway.tenants.auth import DEFAULT_TENANT, Authenticator
from gateway.tenants.limits import Limits
from gateway.upstream.adapters.base import Delta, Final
from gateway.upstream.adapters.calls import upstream_message
from gateway.upstream.http1 import Http1Client


async def serve(app: web.Application) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


@pytest.fixture
async def stubs() -> AsyncIterator[dict[str, str]]:
    servers = {
        "cumulative": await serve(StubServer(StubConfig(model="m")).app()),
        "incremental": await serve(StubServer(StubConfig(model="m", incremental=True)).app()),
        "vllm": await serve(VLLMStub(StubConfig(model="m", k=4)).app()),
    }
    yield {name: str(s.make_url("")).rstrip("/") for name, s in servers.items()}
    for server in servers.values():
        await server.close()


def make_gateway(http1_client: Http1Client, pools: list[dict],
                 max_attempts: int = 2) -> Gateway:
    config = parse_config({"pools": pools, "server": {"max_attempts": max_attempts}})
    gateway = Gateway(config, policy="first", classify=minimal_profile, upstream=http1_client)
    for pool in gateway.pools.values():
        for worker in pool.workers:
            worker.healthy = True  # as if the last health probe had answered
    return gateway


def pool(name: str, workers: list[str], engine: str = "sglang", **caps: object) -> dict:
    return {"name": name, "engine": engine, "method": "eagle", "k": 3, "model": "m",
            "workers": workers, "capabilities": caps}


async def collect(gateway: Gateway, body: dict, endpoint: str = "completions"):
    request = parse_request(body, endpoint)  # type: ignore[arg-type]
    decision, pools = gateway.router.route(request, minimal_profile(request, "t"))
    lease, first, items = await gateway.dispatcher.open_stream(request, decision, pools)
    out = [first] + [item async for item in items]
    lease.release()
    return lease, out


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
async def test_generate_stream_yields_deltas_in_both_sglang_modes(
        http1_client: Http1Client, stubs: dict[str, str], mode: str) -> None:
    gateway = make_gateway(http1_client, [pool("p", [stubs[mode]])])
    _, items = await collect(gateway, {"model": "m", "prompt": "one two three four",
                                       "stream": True})
    assert "".join(i.text for i in items if isinstance(i, Delta)) == "one two three four"
    final = items[-1]
    assert isinstance(final, Final)
    assert final.usage.completion_tokens == 4 and final.finish_reason == "stop"
    assert final.spec.verify_steps == 2 and final.spec.accept_length == 2.0


async def test_vllm_stream_reads_metrics_from_usage_chunk(
        http1_client: Http1Client, stubs: dict[str, str]) -> None:
    gateway = make_gateway(http1_client, [pool("p", [stubs["vllm"]], engine="vllm")])
    _, items = await collect(gateway, {"model": "m", "prompt": "a b c d e f", "stream": True})
    final = items[-1]
    assert isinstance(final, Final) and final.spec.verify_steps == 2
    assert final.spec.accept_length == 3.0 and final.usage.completion_tokens == 6


async def test_failover_to_next_worker_before_first_token(
        http1_client: Http1Client, stubs: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = make_gateway(http1_client, [pool("p", [dead, stubs["cumulative"]])])
    lease, items = await collect(gateway, {"model": "m", "prompt": "x y", "stream": True})
    assert lease.worker.url == stubs["cumulative"]
    refused = gateway.pools["p"].workers[0]
    assert refused.breaker.state(time.monotonic()) is BreakerState.OPEN  # out at once
    assert gateway.pools["p"].pick() is gateway.pools["p"].workers[1]
    assert all(w.outstanding == 0 for w in gateway.pools["p"].workers)
    gateway.pools["p"].workers[1].healthy = False
    request = parse_request({"model": "m", "prompt": "x y"}, "completions")
    with pytest.raises(NoHealthyWorker, match="no healthy worker"):
        gateway.router.route(request, minimal_profile(request, "t"))


async def test_failover_to_fallback_pool_updates_decision(
        http1_client: Http1Client, stubs: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = make_gateway(http1_client, [pool("a", [dead]), pool("b", [stubs["vllm"]], "vllm")])
    body = {"model": "m", "prompt": "x y"}
    request = parse_request(body, "completions")
    decision, pools = gateway.router.route(request, minimal_profile(request, "t"))
    assert decision.pool == "a" and decision.fallbacks == ("b",)
    lease, result = await gateway.dispatcher.generate(request, decision, pools)
    assert lease.decision.pool == "b" and "failover" in lease.decision.reason
    assert result.text == "x y"


async def test_all_workers_failing_gives_upstream_error(
        http1_client: Http1Client) -> None:
    failing = await serve(StubServer(StubConfig(model="m", fail_after=0)).app())
    try:
        url = str(failing.make_url("")).rstrip("/")
        gateway = make_gateway(http1_client, [pool("p", [url])])
        request = parse_request({"model": "m", "prompt": "x"}, "completions")
        decision, pools = gateway.router.route(request, minimal_profile(request, "t"))
        with pytest.raises(UpstreamUnavailable, match="500") as info:
            await gateway.dispatcher.generate(request, decision, pools)
        assert info.value.status == 502
    finally:
        await failing.close()


def test_least_outstanding_worker_is_picked() -> None:
    config = parse_config({"pools": [pool("p", ["http://a:1", "http://b:1"])]})
    p = build_pools(config)["p"]
    for worker, outstanding in zip(p.workers, (3, 1), strict=True):
        worker.healthy, worker.outstanding = True, outstanding
    assert p.pick().url == "http://b:1"
    assert p.pick({"http://b:1"}).url == "http://a:1"
    p.workers[1].draining = True
    assert p.pick().url == "http://a:1"


def test_the_latest_reported_batch_fades_towards_one() -> None:
    """What the pool offers the policy as other traffic on its workers: the latest report,
    1 + (batch - 1) e^(-age / tau); nothing before any report; nonsense ignored."""
    from gateway.pools import REPORTED_BATCH_TAU_S as tau

    p = build_pools(parse_config({"pools": [pool("p", ["http://a:1"])]}))["p"]
    assert p.reported_batch(100.0) == 0.0
    p.note_batch(4.0, 100.0)
    assert p.reported_batch(100.0) == pytest.approx(4.0)
    assert p.reported_batch(100.0 + tau) == pytest.approx(1.0 + 3.0 / 2.718281828)
    assert p.reported_batch(100.0 + 20 * tau) == pytest.approx(1.0, abs=1e-6)
    p.note_batch(2.0, 110.0)  # the latest report replaces the older one
    assert p.reported_batch(110.0) == pytest.approx(2.0)
    for nonsense in (0.0, float("nan"), float("inf"), -3.0):
        p.note_batch(nonsense, 120.0)
    assert p.reported_batch(110.0) == pytest.approx(2.0)


def test_power_of_two_choices_beyond_two_workers() -> None:
    urls = ["http://a:1", "http://b:1", "http://c:1", "http://d:1"]
    p = build_pools(parse_config({"pools": [pool("p", urls)]}))["p"]
    p.rng.seed(7)
    for worker, outstanding in zip(p.workers, (9, 0, 5, 2), strict=True):
        worker.healthy, worker.outstanding = True, outstanding
    picks = Counter(p.pick().url for _ in range(400))
    assert "http://a:1" not in picks  # the busiest never wins a pair
    assert picks["http://b:1"] > picks["http://d:1"] > picks["http://c:1"] > 0


def test_router_filters_by_model_and_capability() -> None:
    config = parse_config({"pools": [
        pool("plain", ["http://a:1"], max_context=100),
        pool("json", ["http://b:1"], constrained_decoding=True, max_context=100)]})
    pools = build_pools(config)
    for p in pools.values():
        p.workers[0].healthy = True
    router = PoolRouter(pools)

    def route(body: dict):
        request = parse_request({"model": "m", "prompt": "hi", **body}, "completions")
        return router.route(request, minimal_profile(request, "t"))

    assert route({})[0].pool == "plain"
    assert route({"response_format": {"type": "json_object"}})[0].pool == "json"
    with pytest.raises(InvalidRequest, match="tools") as info:
        route({"tools": [{"type": "function", "function": {"name": "f"}}]})
    assert info.value.param == "tools"
    with pytest.raises(InvalidRequest, match="max_context"):
        route({"max_tokens": 500})
    with pytest.raises(ModelNotFound):
        route({"model": "other"})


def test_auth_and_rate_limit() -> None:
    config = parse_config({"pools": [pool("p", ["http://a:1"])], "tenants": [
        {"name": "acme", "api_key_sha256": [hash_api_key("k1")], "rate_limit_rpm": 1}]})
    auth = Authenticator(config.tenants)
    assert auth.tenant("Bearer k1").name == "acme"
    for header in (None, "Basic k1", "Bearer nope"):
        with pytest.raises(AuthenticationFailed):
            auth.tenant(header)
    assert Authenticator(()).tenant(None) is DEFAULT_TENANT
    now = [60.0]
    limits = Limits(clock=lambda: now[0])
    asyncio.run(limits.admit(config.tenants[0]))
    now[0] = 119.0
    with pytest.raises(RateLimited) as info:
        asyncio.run(limits.admit(config.tenants[0]))
    assert info.value.retry_after_s == pytest.approx(1.0)
    now[0] = 120.0
    asyncio.run(limits.admit(config.tenants[0]))  # a new minute


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"error": {"message": "bad k"}}', "bad k"),
    (b'{"object": "error", "message": "flat", "code": 400}', "flat"),
    (b'{"error": "plain string"}', "plain string"),
    (b'{"detail": "fastapi"}', "fastapi"),
    (b"<html>oops</html>", "<html>oops</html>"),
])
def test_upstream_error_messages_are_extracted(raw: bytes, message: str) -> None:
    assert upstream_message(raw) == message


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "prompt": "x", "temperature": -0.1}, "temperature"),
    ({"model": "m", "prompt": "x", "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"model": "m", "prompt": "x", "stop": [1]}, "stop"),
    ({"model": "m", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "m", "prompt": "x", "response_format": {"type": "xml"}}, "response_format"),
    ({"model": "m", "prompt": None}, "prompt"),
    ({"model": 5, "prompt": "x"}, "model"),
    ({"model": "m", "prompt": "x", "seed": 1.5}, "seed"),
])
def test_schema_errors_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(body, "completions")
    assert info.value.param == param and info.value.status == 400


def test_token_id_prompts_and_max_completion_tokens() -> None:
    request = parse_request({"model": "m", "prompt": [1, 2, 3], "max_tokens": 9,
                             "max_completion_tokens": 4}, "completions")
    assert request.prompt == [1, 2, 3] and request.max_tokens == 4


def test_record_feeds_recorder_and_one_span() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from gateway.telemetry.worker_stats import SpecStats, Usage
    from policies.types import Decision

    records = []

    class ListRecorder:
        def record(self, record) -> None:
            records.append(record)

    provider, tracer = make_tracer("none")
    spans = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    config = parse_config({"pools": [pool("p", ["http://a:1"])]})
    assert config.pools  # the pool the decision names
    reporter = Reporter(ListRecorder(), {}, Limits().spend, tracer)
    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")
    reporter.record(Outcome(request, minimal_profile(request, "acme"), DEFAULT_TENANT,
                            Decision("p", "eagle", 3, "test"), Timer(), load=2,
                            usage=Usage(5, 9), spec=SpecStats(3, 3.0), ok=True))
    (entry,) = records
    assert (entry.pool, entry.k, entry.output_tokens, entry.verify_steps) == ("p", 3, 9, 3)
    assert entry.temperature_bucket == "t0" and entry.load == 2 and entry.slo_met
    (span,) = spans.get_finished_spans()
    assert span.attributes["specroute.pool"] == "p"
    assert span.attributes["specroute.accept_length"] == 3.0
    assert span.attributes["gen_ai.usage.output_tokens"] == 9
    provider.shutdown()


@pytest.mark.parametrize(("stub", "engine", "endpoint", "body"), [
    ("cumulative", "sglang", "completions", {"prompt": "one two three"}),
    ("cumulative", "sglang", "chat", {"messages": [{"role": "user", "content": "a b c"}]}),
    ("vllm", "vllm", "chat", {"messages": [{"role": "user", "content": "a b c"}]})])
async def test_a_stream_closed_at_its_end_or_midway_leaves_nothing_to_the_gc(
        http1_client: Http1Client, stubs: dict[str, str], stub: str, engine: str, endpoint: str,
        body: dict) -> None:
    """The relay closes an adapter's stream at its Final item, or after its first item
    (a client that left): the generators inside it (SGLang's OpenAI route, the SSE reader)
    close with it, so none is left for the loop's finalizer (a task and a late close of
    the upstream response each)."""
    import gc
    import sys

    gateway = make_gateway(http1_client, [pool("p", [stubs[stub]], engine=engine)])
    request = parse_request({"model": "m", "stream": True, "max_tokens": 3, **body},
                            endpoint)  # type: ignore[arg-type]
    finalized: list[str] = []
    hooks = sys.get_asyncgen_hooks()

    def finalizer(agen) -> None:  # noqa: ANN001
        finalized.append(agen.__qualname__)
        hooks.finalizer(agen)  # type: ignore[misc]  # asyncio's own

    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalizer)
    try:
        for whole in (True, False):
            decision, pools = gateway.router.route(request, minimal_profile(request, "t"))
            lease, first, items = await gateway.dispatcher.open_stream(request, decision,
                                                                       pools)
            if whole:
                seen = [first] + [item async for item in items]
                assert isinstance(seen[-1], Final)
            lease.release()
            await items.aclose()  # type: ignore[attr-defined]
            del items
            gc.collect()
    finally:
        sys.set_asyncgen_hooks(*hooks)
    assert finalized == []
