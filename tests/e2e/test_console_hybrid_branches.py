"""A hybrid pool's branch counts reach the console: a real `specroute worker --method
hybrid` (the bundled tiny model) behind the gateway, the official `openai` client sending
requests through it (streamed and not), headless Chromium on `/console`.

The worker reports each request's `specroute_drafts` (decode steps and accepted draft
tokens per branch); the gateway carries them in the request's record (`extra["drafts"]`)
into the console's pool row (the last hour, summed) and its own `/metrics`
(`specroute_draft_branch_*_total{pool, branch}`). The worker sees only these requests, so
its own counters since start must equal what the gateway summed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import httpx
import openai
import pytest
from conftest import stop_process
from gateway_harness import start_gateway, start_worker
from test_console_browser import (
    ADMIN_KEY,
    CHROMIUM,
    CHROMIUM_ARGS,
    KEY,
    TINY,
    admin_state,
    require_browser,
    wait_for,
)
from test_worker_hybrid_branches import BRANCHES, FAMILIES, TEXT, counters

from gateway.config import hash_api_key
from workers.models import BUNDLED_MODEL_DIR


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: str) -> Iterator[dict]:
    require_browser()
    tmp = tmp_path_factory.mktemp("console-hybrid")
    procs = []
    try:
        worker, url = start_worker(tmp, "hybrid", BUNDLED_MODEL_DIR, name="hybrid")
        procs.append(worker)
        config = {
            "redis_url": redis_server,
            "server": {"admin_api_key_sha256": hash_api_key(ADMIN_KEY), "health_interval_s": 0.5},
            "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key(KEY)]}],
            "pools": [{"name": "hybrid", "engine": "embedded", "method": "hybrid", "k": 3,
                       "model": TINY, "workers": [url],
                       "capabilities": {"per_request_k": True}}]}
        proc, gateway = start_gateway(tmp, config, policy="learned")
        procs.append(proc)
        yield {"gateway": gateway, "worker": url}
    finally:
        for proc in reversed(procs):
            stop_process(proc)


def gateway_counters(gateway: str) -> dict[tuple[str, str], float]:
    """(family, branch) -> the gateway's counter for the hybrid pool."""
    out = {}
    for line in httpx.get(f"{gateway}/metrics", timeout=10,
                             headers={"Authorization": f"Bearer {ADMIN_KEY}"}).text.splitlines():
        if line.startswith("specroute_draft_branch_") and 'pool="hybrid"' in line:
            name, value = line.rsplit(" ", 1)
            family = name.split("{")[0].removeprefix("specroute_draft_branch_")
            out[(family.removesuffix("_total"), name.split('branch="')[1].split('"')[0])] = \
                float(value)
    return out


def test_branch_counts_in_the_console_and_metrics(stack: dict) -> None:
    from playwright.sync_api import sync_playwright

    gateway, worker = stack["gateway"], stack["worker"]
    acme = openai.OpenAI(base_url=gateway + "/v1", api_key=KEY, max_retries=0, timeout=60)
    messages = [{"role": "user", "content": TEXT}]  # repeats: the n-gram branch copies
    for i in range(4):
        if i % 2:
            chunks = list(acme.chat.completions.create(
                model=TINY, messages=messages, max_tokens=16, temperature=0.0, stream=True))
            assert chunks[-1].choices[0].finish_reason is not None
        else:
            answer = acme.chat.completions.create(model=TINY, messages=messages,
                                                  max_tokens=16, temperature=0.0)
            assert answer.choices[0].finish_reason is not None
    seen = counters(worker)  # the worker served these four requests and nothing else
    assert seen[("steps", "ngram")] > 0

    def drafts() -> dict | None:
        return next(p for p in admin_state(gateway)["pools"] if p["pool"] == "hybrid")["drafts"]

    wait_for(lambda: drafts() is not None and
             sum(d["steps"] for d in drafts().values())  # type: ignore[union-attr]
             == sum(v for (f, _), v in seen.items() if f == "steps"), 20, "the branch counts")
    shown = drafts()
    assert shown is not None
    for branch in BRANCHES:
        assert shown[branch]["steps"] == seen[("steps", branch)], branch
        assert shown[branch]["accepted"] == seen[("accepted_tokens", branch)], branch
    exported = gateway_counters(gateway)
    for family in FAMILIES:
        for branch in BRANCHES:
            assert exported[(family, branch)] == seen[(family, branch)], (family, branch)

    problems: list[str] = []
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        browser = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            http_credentials={"username": "ops", "password": ADMIN_KEY})
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
                    if m.type == "error" else None)
            page.goto(gateway + "/console")
            page.wait_for_selector("#status[data-state=ok]", timeout=20_000)
            text = wait_for(lambda: page.locator("#pools tbody td.drafts").all_text_contents(),
                            20, "the pools table")
            ngram = shown["ngram"]
            assert text == [" · ".join(
                f"none {d['steps']}" if b == "none" else
                f"{b} {d['steps']} steps, {d['accepted']} accepted"
                for b, d in shown.items())], text
            assert f"ngram {ngram['steps']} steps, {ngram['accepted']} accepted" in text[0]
        finally:
            browser.close()
    assert not problems, problems
