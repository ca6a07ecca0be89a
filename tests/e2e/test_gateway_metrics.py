"""Operators see errors: `/metrics` counts every answer by route and status (400, 401,
404, 413 and 500 included, which never reach the per-request recorder), gauges each
pool's workers, and the optional access log has one line per request (method, route,
status, latency, tenant; never the key or the prompt). Real processes: a stub worker and
a gateway; the scrape is read with prometheus_client's own parser.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from conftest import stop_process, wait_http
from gateway_harness import start_gateway, start_stub
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import hash_api_key

KEY = "sk-metrics-SECRET-KEY"
PROMPT_SECRET = "PROMPT-SECRET-9931"

GATEWAY_MAIN = """
import logging
import sys
import uvicorn
from gateway.http.app import create_app
from gateway.config import load_config
from gateway.classifier.minimal import minimal_profile
from policies.rules import first_healthy
from gateway.http.serve import uvicorn_options

def decide(profile, pools):
    if profile.max_tokens == 7:  # the test's way to reach a bug in the policy
        raise RuntimeError("policy broke")
    return first_healthy(profile, pools)

config = load_config(sys.argv[1])
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
uvicorn.run(create_app(config, decide=decide, classify=minimal_profile), host="127.0.0.1", port=int(sys.argv[2]),
            **uvicorn_options(config.server))
"""


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of the scrape: (name, sorted labels) -> value."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def responses(samples: dict, route: str, status: int) -> float:
    return samples.get(("specroute_http_responses_total",
                        (("route", route), ("status", str(status)))), 0.0)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("metrics")
    stub, worker = start_stub(tmp, "worker", "--model", "m")
    config = {"server": {"access_log": True, "max_body_bytes": 2048,
                         "health_interval_s": 0.2, "unhealthy_after": 1},
              "pools": [{"name": "p", "engine": "sglang", "method": "plain", "k": 0,
                         "model": "m", "workers": [worker]}],
              "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]}]}
    try:
        proc, url = start_gateway(tmp, config, name="gw", script=GATEWAY_MAIN)
    except BaseException:
        stop_process(stub)
        raise
    try:
        wait_http(url + "/ready", 30, proc)
        yield {"url": url, "stub": stub, "log": tmp / "gw.log"}
    finally:
        stop_process(proc)
        stop_process(stub)


def test_every_answer_is_counted_by_route_and_status(stack: dict) -> None:
    url = stack["url"]
    auth = {"Authorization": f"Bearer {KEY}"}
    chat = "/v1/chat/completions"
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user",
                                                         "content": PROMPT_SECRET}]}
    before = scrape(url)
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.post(chat, json=body, headers=auth).status_code == 200
        assert client.post(chat, json=body).status_code == 401
        typed = {**auth, "Content-Type": "application/json"}
        assert client.post(chat, content=b"{not json", headers=typed).status_code == 400
        assert client.post(chat, content=b"x" * 4096, headers=typed).status_code == 413
        broken = {**body, "max_tokens": 7}
        assert client.post(chat, json=broken, headers=auth).status_code == 500
        assert client.get("/v1/models/nope", headers=auth).status_code == 404
        assert client.get("/no/such/route").status_code == 404
        assert client.get(chat).status_code == 405
    after = scrape(url)
    for route, status in [(chat, 200), (chat, 401), (chat, 400), (chat, 413), (chat, 500),
                          ("/v1/models/{model:path}", 404), ("other", 404), (chat, 405)]:
        assert responses(after, route, status) - responses(before, route, status) == 1, \
            (route, status)
    latency = ("specroute_http_request_seconds_count", (("route", chat),))
    assert after[latency] - before.get(latency, 0.0) == 6


def test_access_log_has_route_status_and_tenant_never_key_or_prompt(stack: dict) -> None:
    url = stack["url"]
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": PROMPT_SECRET,
                                              "max_tokens": 2},
               headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=10)
    time.sleep(0.3)
    text = stack["log"].read_text()
    lines = [line for line in text.splitlines() if "specroute.access" in line]
    assert any("POST /v1/completions 200 " in line and "tenant=acme" in line
               for line in lines), lines
    assert any("GET /v1/models 401 " in line and "tenant=-" in line for line in lines)
    assert KEY not in text and PROMPT_SECRET not in text


def test_worker_gauges_follow_the_pool(stack: dict) -> None:
    url = stack["url"]
    up = ("specroute_pool_workers_up", (("pool", "p"),))
    known = ("specroute_pool_workers", (("pool", "p"),))
    samples = scrape(url)
    assert samples[up] == 1 and samples[known] == 1
    assert samples[("specroute_event_loop_tasks", ())] >= 1  # the scrape's own, at least
    assert samples[("process_open_fds", ())] > 0
    assert samples[("process_resident_memory_bytes", ())] > 0
    stack["stub"].send_signal(signal.SIGSTOP)  # hangs: its probes time out
    try:
        deadline = time.monotonic() + 15
        while scrape(url)[up] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        samples = scrape(url)
        assert samples[up] == 0 and samples[known] == 1
        assert samples[("specroute_pool_last_resort", (("pool", "p"),))] == 1  # hung only
    finally:
        stack["stub"].send_signal(signal.SIGCONT)
    wait_http(url + "/ready", 15)
    assert scrape(url)[up] == 1
