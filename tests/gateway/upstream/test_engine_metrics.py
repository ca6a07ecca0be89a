"""The engines' own speculation counters (`/metrics`) as an accept length per interval:
parsing both engines' names, the interval arithmetic, and the scraper over real HTTP."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.config import parse_config
from gateway.pools import build_pools
from gateway.upstream.engine_metrics import Counters, EngineMetrics, parse_counters

VLLM_PAGE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {drafts}
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {tokens}
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",model_name="m",position="0"}} 9
vllm:num_requests_running{{engine="0",model_name="m"}} 0.0
"""


def test_both_engines_counters_are_read_with_either_spelling() -> None:
    page = VLLM_PAGE.format(drafts=10.0, tokens=40.0, accepted=25.0)
    assert parse_counters(page) == Counters(drafts=10.0, accepted=25.0)
    sglang = ('sglang_spec_verify_calls_total{model_name="m"} 4\n'
              'sglang:generation_tokens_total{model_name="m",is_streaming="false"} 9\n'
              'sglang:generation_tokens_total{model_name="m",is_streaming="true"} 3\n'
              'sglang:spec_accept_length{model_name="m"} 7.5\nnot a sample\n')
    assert parse_counters(sglang) == Counters(drafts=4.0, generated=12.0)
    assert parse_counters("garbage {\n\x00\n") == Counters()


def test_accept_length_over_an_interval() -> None:
    before, after = Counters(10, 25), Counters(14, 37)  # 4 steps, 12 accepted
    assert after.accept_length(before, "vllm") == pytest.approx(4.0)
    assert before.accept_length(before, "vllm") is None  # no new steps
    assert Counters(2, 1).accept_length(before, "vllm") is None  # restarted: went back
    assert Counters(drafts=6, generated=30).accept_length(
        Counters(drafts=2, generated=10), "sglang") == pytest.approx(5.0)


async def test_the_scraper_reads_each_worker_and_exports_the_pool() -> None:
    pages = iter([(0, 0, 0), (10, 40, 25), (10, 40, 25)])

    async def metrics(request: web.Request) -> web.Response:
        drafts, tokens, accepted = next(pages)
        return web.Response(text=VLLM_PAGE.format(drafts=drafts, tokens=tokens,
                                                  accepted=accepted))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        config = parse_config({"pools": [
            {"name": "v", "engine": "vllm", "method": "ngram", "k": 4, "model": "m",
             "workers": [f"http://127.0.0.1:{port}"]},
            {"name": "p", "engine": "vllm", "method": "plain", "model": "m",
             "workers": [f"http://127.0.0.1:{port}"]}]})
        registry = CollectorRegistry()
        async with aiohttp.ClientSession() as session:
            scraper = EngineMetrics(build_pools(config), session, registry, 1.0)
            await scraper.scrape()  # the first page only sets the baseline
            assert scraper.accept_length == {}
            await scraper.scrape()
            assert scraper.accept_length == {"v": pytest.approx(3.5)}  # 1 + 25 / 10
            await scraper.scrape()  # nothing new: the last figure stands
            assert scraper.accept_length == {"v": pytest.approx(3.5)}
        assert registry.get_sample_value("specroute_engine_accept_length",
                                         {"pool": "v"}) == pytest.approx(3.5)
    finally:
        await runner.cleanup()
