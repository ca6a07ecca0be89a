"""The gateway hands the policy what workers measured about themselves: an embedded
worker's measured.json (via /server_info or its registry entry), an SGLang server's
average accept length, or nothing (vLLM): then the policy's flat prior applies."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config import parse_config
from gateway.pools import build_pools
from gateway.upstream.adapters.sglang import prior_from_server_info
from gateway.upstream.worker_priors import WorkerPriors
from policies.acceptance import expected_accept_length
from policies.prior import WorkerPrior
from tests.policies.test_policy_prior import MEASURED
from workers.fleet.registry import WorkerInfo


def pools(urls: dict[str, str]) -> dict:
    return build_pools(parse_config({"pools": [
        {"name": name, "engine": engine, "model": "m", "method": method, "k": 4,
         "workers": [url]} for name, (engine, method, url) in {
            "ngram": ("embedded", "ngram", urls["embedded"]),
            "eagle3": ("sglang", "eagle3", urls["sglang"]),
            "vllm": ("vllm", "eagle3", urls["sglang"]),
            "late": ("sglang", "eagle", urls["late"])}.items()]}))


def test_server_info_bodies_to_priors() -> None:
    pool = pools(dict.fromkeys(("embedded", "sglang", "late"), "http://a:1"))["ngram"].config
    embedded = prior_from_server_info(pool, {"specroute_measured": MEASURED})
    assert embedded is not None
    assert embedded.acceptance[("m", "ngram", "code", "t0")] == pytest.approx(0.85, abs=1e-3)
    assert embedded.acceptance[("m", "ngram", "chat", "thigh")] == pytest.approx(0.15, abs=1e-3)
    sglang = prior_from_server_info(pool, {"speculative_num_steps": 3, "internal_states": [
        {"avg_spec_accept_length": expected_accept_length(0.7, 3)}]})
    assert sglang is not None
    assert {round(a, 6) for a in sglang.acceptance.values()} == {0.7}
    assert prior_from_server_info(pool, {"internal_states": [{}]}) is None
    broken = {"specroute_measured": {**MEASURED, "entries": 3}}
    assert prior_from_server_info(pool, broken) is None


async def test_priors_from_server_info_and_registry() -> None:
    late_ready = False

    async def embedded(_: web.Request) -> web.Response:
        return web.json_response({"specroute_measured": MEASURED})

    async def sglang(_: web.Request) -> web.Response:
        return web.json_response({"speculative_num_steps": 3, "internal_states": [
            {"avg_spec_accept_length": 3.0}]})

    async def late(_: web.Request) -> web.Response:  # no traffic yet: no average
        states = [{"avg_spec_accept_length": 2.5}] if late_ready else [{}]
        return web.json_response({"speculative_num_steps": 3, "internal_states": states})

    servers = {}
    for name, handler in (("embedded", embedded), ("sglang", sglang), ("late", late)):
        app = web.Application()
        app.router.add_get("/server_info", handler)
        servers[name] = TestServer(app, host="127.0.0.1")
        await servers[name].start_server()
    got: dict[str, WorkerPrior] = {}
    try:
        built = pools({n: str(s.make_url("")).rstrip("/") for n, s in servers.items()})
        async with aiohttp.ClientSession() as session:
            priors = WorkerPriors(built, session, got.__setitem__, 1.0)
            await priors.probe_missing()
            assert set(got) == {"ngram", "eagle3"}  # vLLM has no /server_info; late: none
            late_ready = True
            await priors.probe_missing()
            assert set(got) == {"ngram", "eagle3", "late"}
        eagle = got["eagle3"].acceptance[("m", "eagle3", "chat", "t0")]
        assert eagle == pytest.approx(0.81, abs=0.01)  # E(a, 3) = 3.0
        registry = WorkerPriors(built, None, got.__setitem__, 1.0)  # type: ignore[arg-type]
        got.clear()
        info = WorkerInfo(url="http://w:1", pool="ngram", engine="embedded", method="ngram",
                          k=4, model="m", started_at=0.0, pid=1, measured=MEASURED)
        registry.from_registry(built["ngram"], info)
        assert got["ngram"].acceptance[("m", "ngram", "code", "t0")] == pytest.approx(
            0.85, abs=1e-3)
    finally:
        for server in servers.values():
            await server.close()
