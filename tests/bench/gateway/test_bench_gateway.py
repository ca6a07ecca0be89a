"""`specroute bench gateway`: the upstream answers what every peer asks of it, a peer
that cannot be installed is reported (never dropped), and the summary's ratios."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from bench.gateway import peers
from bench.gateway.overhead import Target, _start, _start_peer, _table, stop_all, summarize
from bench.gateway.upstream import app
from workers.processes import free_port


@pytest.fixture
async def upstream():
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://up") as client:
        yield client


@pytest.mark.parametrize("path", ["/health", "/server_info", "/get_server_info",
                                  "/model_info", "/v1/models"])
async def test_upstream_answers_the_probes_of_sglang_router(upstream, path: str) -> None:
    answer = await upstream.get(path)
    assert answer.status_code == 200
    assert isinstance(answer.json(), dict)


async def test_upstream_chat_completions_plain_and_streamed(upstream) -> None:
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
    plain = (await upstream.post("/v1/chat/completions", json=body)).json()
    assert plain["choices"][0]["message"]["content"].strip()
    assert plain["usage"]["completion_tokens"] == 8
    streamed = await upstream.post("/v1/chat/completions", json={**body, "stream": True})
    assert streamed.headers["content-type"] == "text/event-stream"
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("client", ["aiohttp", "http1"])
def test_the_minimal_proxy_relays_the_upstream(tmp_path: Path, client: str) -> None:
    """Both minimal proxies answer what the upstream does, byte for byte, plain and
    streamed (over real sockets: `bench.gateway.upstream` and the proxy as processes)."""
    procs: list = []
    up, proxy = free_port(), free_port()
    try:
        _start(procs, [sys.executable, "-m", "bench.gateway.upstream", "--port", str(up)],
               f"http://127.0.0.1:{up}/health", "upstream", tmp_path / "up.log")
        _start(procs, [sys.executable, "-m", "bench.gateway.minproxy", "--port", str(proxy),
                       "--upstream", f"http://127.0.0.1:{up}", "--client", client],
               f"http://127.0.0.1:{proxy}/health", "minimal proxy", tmp_path / "proxy.log")
        body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
        for stream in (False, True):
            answers = [httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                  json={**body, "stream": stream}) for port in (up, proxy)]
            assert [a.status_code for a in answers] == [200, 200]
            assert answers[0].content == answers[1].content
    finally:
        stop_all(procs)


def test_a_peer_that_cannot_be_installed_is_reported(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = peers.Peer("broken", str(tmp_path / "no-such-package"), "no_such_module",
                        lambda *_: ["false"], "/health")
    procs: list = []
    target = _start_peer(procs, broken, "http://127.0.0.1:9", tmp_path)
    assert not procs
    assert target.error.startswith("not installed: ")
    assert not (tmp_path / "cache" / "specroute" / "peers" / "broken" /
                "specroute-installed.json").exists()


def _measured(name: str, p50_ms: float, rps: float) -> Target:
    target = Target(name, "http://x")
    for stream in (False, True):
        target.latency[stream] = [p50_ms] * 10
        target.done[stream], target.seconds[stream] = int(rps), 1.0
    return target


def test_summary_keeps_failed_peers_and_gives_ratios() -> None:
    targets = [_measured("direct", 0.3, 9000), _measured("specroute", 0.8, 3000),
               _measured("sglang-router", 0.6, 4000),
               Target("litellm", error="not installed: no network")]
    result = summarize(targets)
    assert result["specroute_rps_over_sglang_router"] == 0.75
    assert result["specroute_rps_over_sglang_router_stream"] == 0.75
    assert result["specroute_rps_over_litellm"] is None
    rows = {(r["path"], r["stream"]): r for r in result["rows"]}
    assert rows[("litellm", False)]["error"] == "not installed: no network"
    assert rows[("specroute", False)]["added_p50_ms"] == 0.5
    assert any("not installed: no network" in line for line in _table(result))


def test_json_gives_every_ratio_the_issue_asks_for() -> None:
    """The keys `--json` ends with: throughput over the minimal proxy, smg, LiteLLM (and
    streamed), added p50, loop lag p99 (the bucket's bound) and classify + decide p99."""
    ours = _measured("specroute", 1.2, 1700)
    ours.metrics = "http://x/metrics"
    ours.lag_buckets = {0.001: 50.0, 0.002: 99.5, 0.005: 100.0, float("inf"): 100.0}
    targets = [_measured("direct", 0.5, 4000), _measured("minimal proxy", 0.9, 2000),
               _measured("minimal proxy http1", 0.8, 2500), ours,
               _measured("smg", 0.8, 3400), _measured("litellm", 14.0, 85)]
    result = summarize(targets, classify_decide_p99_us=87.5)
    assert result["specroute_rps_over_minimal_proxy"] == 0.85
    assert result["specroute_rps_over_minimal_proxy_http1"] == 0.68
    assert result["specroute_rps_over_minimal_proxy_stream"] == 0.85
    assert result["specroute_rps_over_smg"] == 0.5
    assert result["specroute_rps_over_smg_stream"] == 0.5
    assert result["specroute_rps_over_litellm"] == 20.0
    assert result["specroute_rps_over_sglang_router"] is None  # not in this run
    assert result["specroute_added_p50_ms"] == 0.7
    assert result["specroute_added_p50_ms_stream"] == 0.7
    assert result["loop_lag_p99_ms"] == 2.0
    assert result["classify_decide_p99_us"] == 87.5
    assert orjson.loads(orjson.dumps(result)) == result  # one JSON object


def test_loop_lag_past_the_last_bucket_is_no_number() -> None:
    from bench.gateway.overhead import lag_p99_ms

    assert lag_p99_ms({0.5: 10.0, float("inf"): 100.0}) is None  # JSON has no Infinity
    assert lag_p99_ms({0.001: 99.0, 0.5: 100.0, float("inf"): 100.0}) == 1.0


def test_the_classifier_bench_counts_tasks_per_category(tmp_path) -> None:  # noqa: ANN001
    from bench.gateway.classifier import categories

    rows = [{"category": "translation", "messages": [{"role": "user", "content":
             "Translate this French text into English.\n\nJe n'ai pas le temps."}]},
            {"category": "code", "messages": [{"role": "user", "content":
             "Write a Python function that reverses a list."}]}]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert categories(path) == {"translation": {"chat": 1}, "code": {"code": 1}}
