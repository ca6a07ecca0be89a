"""The console in a real browser: headless Chromium (Debian's `chromium`, driven by
playwright with `executable_path`, never a browser of its own) opens `/console` on a real
stack — Redis, two SGLang-shaped stub workers, one real embedded worker of the bundled
model, the gateway with the learned policy and an admin key — while the official `openai`
client sends traffic. It checks that the table and the plots update, that the page logs
no console error and no request of it fails, that the admin guard holds, and that no
prompt text or API key reaches the page. A screenshot is left in the test's folder (or at
$SPECROUTE_CONSOLE_SCREENSHOT).

Skipped without Chromium or playwright unless SPECROUTE_REQUIRE_BROWSER is set
(scripts/test.sh sets it and installs both).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import stop_process
from gateway_harness import start_gateway, start_stubs, start_worker

from gateway.config import hash_api_key
from workers.models import BUNDLED_MODEL_DIR

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ADMIN_KEY = "console-admin-key-4417"
KEY = "sk-console-acme-9925"
LIMITED_KEY = "sk-console-limited-3381"
MARKER = "quokkamarker"  # in every prompt; the stubs echo it back in their answers
TINY = "specroute-tiny"


def browser_available() -> str | None:
    """Why the browser test cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM}"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    return None


def require_browser() -> None:
    """Skip without Chromium or playwright; fail instead where SPECROUTE_REQUIRE_BROWSER
    is set (CI)."""
    missing = browser_available()
    if missing is not None:
        if os.environ.get("SPECROUTE_REQUIRE_BROWSER"):
            pytest.fail(f"SPECROUTE_REQUIRE_BROWSER is set but {missing}")
        pytest.skip(missing)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    require_browser()
    import redis

    with redis.Redis.from_url(redis_server) as fresh:  # no rate-limit counts left by others
        fresh.flushall()
    tmp = tmp_path_factory.mktemp("console")
    procs = []
    try:
        stubs, urls = start_stubs(tmp, {
            "eagle": ["--model", "m", "--method", "eagle", "--k", "3", "--accept-length",
                      "2.5", "--step-s", "0.004"],
            "plain": ["--model", "m", "--method", "plain", "--k", "0", "--step-s", "0.003"]})
        procs.extend(stubs.values())
        worker, embedded = start_worker(tmp, "ngram", BUNDLED_MODEL_DIR, name="embedded")
        procs.append(worker)
        config = {
            "redis_url": redis_server,
            "server": {"admin_api_key_sha256": hash_api_key(ADMIN_KEY), "health_interval_s": 0.5},
            "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)], "may_pin": True,
                         "slo_ttft_ms": 1500, "slo_tpot_ms": 100},
                        {"name": "limited", "api_key_sha256": [hash_api_key(LIMITED_KEY)],
                         "rate_limit_rpm": 2}],
            "pools": [{"name": "eagle", "engine": "sglang", "method": "eagle", "k": 3,
                       "model": "m", "workers": [urls["eagle"]]},
                      {"name": "plain", "engine": "sglang", "method": "plain", "model": "m",
                       "workers": [urls["plain"]]},
                      {"name": "embedded-ngram", "engine": "embedded", "method": "ngram",
                       "k": 4, "model": TINY, "workers": [embedded],
                       "capabilities": {"per_request_k": True}}]}
        proc, gateway = start_gateway(tmp, config, policy="learned")
        procs.append(proc)
        yield {"gateway": gateway, "tmp": tmp}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def client(gateway: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key=key, max_retries=0, timeout=60)


def send_traffic(gateway: str, rounds: int) -> None:
    """Code and chat, greedy and sampled, streamed and not, to every pool (pinned) and
    to the policy's pick; every prompt carries MARKER."""
    acme = client(gateway)
    prompts = [f"Fix this {MARKER} function:\n```python\ndef add(a, b):\n    return a - b\n```",
               f"Tell me about the {MARKER} in a few words please."]
    for i in range(rounds):
        for prompt in prompts:
            for model, pin in (("m", "eagle"), ("m", "plain"), ("m", None), (TINY, None)):
                headers = {"x-specroute-pool": pin} if pin else {}
                messages = [{"role": "user", "content": prompt}]
                if i % 2:
                    stream = acme.chat.completions.create(
                        model=model, messages=messages, max_tokens=16, temperature=0.0,
                        stream=True, extra_headers=headers)
                    chunks = list(stream)  # the tiny model may say little; the stubs echo
                    assert chunks and chunks[-1].choices[0].finish_reason is not None
                else:
                    answer = acme.chat.completions.create(
                        model=model, messages=messages, max_tokens=16, temperature=1.0,
                        extra_headers=headers)
                    assert answer.choices[0].finish_reason is not None


def wait_for(check: Callable[[], object], timeout_s: float, what: str) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def admin_state(gateway: str) -> dict:
    response = httpx.get(gateway + "/v1/console/state", timeout=10,
                         headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 200
    return response.json()


def test_the_admin_guard_holds(stack: dict) -> None:
    gateway = stack["gateway"]
    for path in ("/console", "/v1/console/state"):
        refused = httpx.get(gateway + path, timeout=10)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"].startswith("Basic ")
        assert refused.json()["error"]["type"] == "authentication_error"
        tenant = httpx.get(gateway + path, timeout=10, headers={"Authorization": f"Bearer {KEY}"})
        assert tenant.status_code == 401, path  # a tenant's key is no admin key
        assert httpx.get(gateway + path, timeout=10, auth=("ops", ADMIN_KEY)).status_code == 200


def test_the_console_updates_live_in_chromium(stack: dict) -> None:
    from playwright.sync_api import sync_playwright

    gateway = stack["gateway"]
    problems: list[str] = []
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        browser = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            http_credentials={"username": "ops", "password": ADMIN_KEY},
            viewport={"width": 1400, "height": 1800})
        try:
            page = browser.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: problems.append(f"failed: {r.url}"))
            page.on("response", lambda r: problems.append(f"{r.status}: {r.url}")
                    if r.status >= 400 else None)
            page.goto(gateway + "/console")
            page.wait_for_selector("#status[data-state=ok]", timeout=20_000)

            def number(selector: str, attribute: str) -> int:
                return int(page.get_attribute(selector, attribute) or 0)

            # 2 models x 4 tasks x 3 temperature buckets, predicted before any traffic
            assert number("#routing", "data-rows") == 24
            assert number("#fleet", "data-rows") == 3
            assert number("#plot-accept", "data-points") == 0
            assert number("#decisions", "data-rows") == 0
            polls = number("#status", "data-polls")

            send_traffic(gateway, rounds=2)
            limited = client(gateway, LIMITED_KEY)
            refused = 0
            for _ in range(4):
                try:
                    limited.chat.completions.create(
                        model="m", max_tokens=4,
                        messages=[{"role": "user", "content": f"hi {MARKER}"}])
                except openai.RateLimitError:
                    refused += 1
            assert refused >= 1

            # the page refreshes itself: points for each pool, decisions, observed tok/s
            wait_for(lambda: number("#plot-accept", "data-points") >= 3, 30, "accept points")
            wait_for(lambda: number("#plot-tps", "data-points") >= 3, 30, "tokens/s points")
            wait_for(lambda: number("#decisions", "data-rows") == 16 + 4 - refused, 30, "decisions")
            assert number("#status", "data-polls") > polls
            observed = page.locator("#routing tbody tr td:nth-child(9)").all_text_contents()
            assert any(text != "–" for text in observed), observed
            tenants = page.locator("#tenants tbody tr").all_text_contents()
            assert any(row.startswith("limited") for row in tenants)
            state = admin_state(gateway)
            tenant = {t["tenant"]: t for t in state["tenants"]}
            assert tenant["limited"]["rate_limited"] == refused
            assert tenant["acme"]["requests"] == 16 and tenant["acme"]["ttft_p99_ms"] > 0
            assert state["gateway"]["registry_error"] is None
            assert state["gateway"]["registry_read_at"] is not None

            def eagle_desired_k() -> object:  # the policy's wish, as the console read it
                fleet = admin_state(gateway)["fleet"][0]["pools"]
                return next(p for p in fleet if p["pool"] == "eagle")["desired_k"]

            # published by the next refit's telemetry flush, read by the console's next tick
            wait_for(lambda: isinstance(eagle_desired_k(), int), 30, "eagle's desired k")
            pools = {p["pool"]: p for p in state["pools"]}

            def accepts(pool: str) -> list[float]:
                return [s["accept_length"] for s in pools[pool]["samples"]
                        if s["accept_length"] is not None]

            assert accepts("eagle") and all(a == pytest.approx(2.5, rel=0.2)
                                            for a in accepts("eagle"))  # what the stub reports
            assert accepts("embedded-ngram") and min(accepts("embedded-ngram")) >= 1.0
            assert "measured" in pools["embedded-ngram"]["prior"]["source"] or \
                "server_info" in pools["embedded-ngram"]["prior"]["source"]

            # a closed sample, then more traffic: the plots draw lines through time
            def closed_sample() -> bool:
                return any(not s["live"] for s in admin_state(gateway)["pools"][0]["samples"])

            wait_for(closed_sample, 30, "a closed sample")
            send_traffic(gateway, rounds=1)
            wait_for(lambda: page.locator("#plot-accept polyline").count() >= 2, 30,
                     "lines in the accept plot")
            wait_for(lambda: all(row["planned"] is not None
                                 for model in admin_state(gateway)["fleet"]
                                 for row in model["pools"]), 40, "a fleet plan")
            wait_for(lambda: "–" not in page.locator("#fleet tbody tr td:nth-child(8)")
                     .all_text_contents(), 10, "planned workers in the fleet table")

            html = page.content()
            for secret in (MARKER, KEY, LIMITED_KEY, ADMIN_KEY, hash_api_key(KEY)):
                assert secret not in html
                assert secret not in str(state)
            shot = Path(os.environ.get("SPECROUTE_CONSOLE_SCREENSHOT")
                        or stack["tmp"] / "console.png")
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
        finally:
            browser.close()
    assert not problems, problems
