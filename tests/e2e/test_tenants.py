"""Tenants: secure defaults, keys, reload, per-tenant caps, and the limits shared by
replicas, through the real `specroute gateway` and a real Redis.

Keys here are made up by the tests and stored only as digests in the configs they write.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import ROOT, free_port, start_process, stop_process, wait_http
from gateway_harness import start_stub

from gateway.config import ConfigError, hash_api_key, load_config, parse_config
from gateway.errors import (
    InvalidRequest,
    LimiterUnavailable,
    ModelNotFound,
    PermissionDenied,
    RateLimited,
)
from gateway.pins import Pin
from gateway.schemas import parse_request
from gateway.tenants.auth import Authenticator, TenantReloader, authorize, check_exposure
from gateway.tenants.keys import KEY_PREFIX, add_key
from gateway.tenants.limits import WINDOW_S, Limits

KEY = "sk-test-tenant-a"
POOL = {"name": "p", "engine": "sglang", "method": "eagle", "k": 3, "model": "m"}


def config_with(worker: str, **extra: object) -> dict:
    return {"server": {"health_interval_s": 0.5}, "pools": [{**POOL, "workers": [worker]}],
            **extra}


def start_cli_gateway(tmp: Path, config_path: Path, name: str = "gw"
                      ) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = start_process(["-m", "specroute.cli", "gateway", "--config", str(config_path),
                          "--port", str(port), "--policy", "first"], tmp / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 60, proc)
    return proc, url


def chat(url: str, key: str | None, **body: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", headers=headers, timeout=10, json={
        "model": "m", "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": 2, **body})


# -- secure defaults ------------------------------------------------------------------------
def test_an_open_gateway_is_refused_on_a_public_address(tmp_path: Path) -> None:
    pools = [{**POOL, "workers": ["http://127.0.0.1:9"]}]
    open_config = parse_config({"pools": pools})
    assert check_exposure(open_config, "0.0.0.0") is not None
    assert check_exposure(open_config, "::") is not None
    assert check_exposure(open_config, "127.0.0.1") is None
    assert check_exposure(open_config, "localhost") is None
    assert check_exposure(parse_config({"pools": pools, "auth": "none"}), "0.0.0.0") is None
    keyed = parse_config({"pools": pools, "tenants": [{"name": "a",
                                                       "api_key_sha256": [hash_api_key(KEY)]}]})
    assert check_exposure(keyed, "0.0.0.0") is None
    with pytest.raises(ConfigError, match="auth"):
        parse_config({"pools": pools, "auth": "none", "tenants": [{"name": "a"}]})
    # the real command exits before binding anything
    path = tmp_path / "open.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    done = subprocess.run([sys.executable, "-m", "specroute.cli", "gateway", "--config",
                           str(path), "--host", "0.0.0.0", "--port", str(free_port())],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "refusing to listen on 0.0.0.0 with no tenants" in done.stderr


def test_up_refuses_a_public_address(tmp_path: Path) -> None:
    from specroute.stack import run_stack

    assert run_stack(host="0.0.0.0", workdir=str(tmp_path)) == 2  # before anything starts


def test_the_repository_ships_no_plaintext_key() -> None:
    """Every digest in the deploy configs belongs to no key written anywhere in the repo."""
    for path in [*ROOT.glob("deploy/**/*.yaml"), ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        text = path.read_text()
        assert "sk-specroute-demo" not in text, path
        assert "12775b362e5453f8ab51087984c37df2f96b71b97029b343f14abe162380b0d4" not in text


def test_keys_add_prints_the_key_once_and_writes_its_digest(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"pools": [{**POOL, "workers": ["http://127.0.0.1:9"]}]}))
    done = subprocess.run([sys.executable, "-m", "specroute.cli", "keys", "add", "acme",
                           "--config", str(path), "--slo-ttft-ms", "300", "--priority", "5"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    assert key.startswith(KEY_PREFIX) and len(key) > 40
    assert key not in path.read_text()
    tenant = load_config(path).tenants[0]
    assert (tenant.name, tenant.slo_ttft_ms, tenant.priority) == ("acme", 300.0, 5)
    assert tenant.api_key_sha256 == (hash_api_key(key),)
    assert Authenticator(load_config(path).tenants).tenant(f"Bearer {key}").name == "acme"
    second = add_key(path, "acme")  # a second key for the same tenant
    assert load_config(path).tenants[0].api_key_sha256 == (hash_api_key(key),
                                                           hash_api_key(second))
    # with a tenants_file, the hand-written config is left as it is
    main = tmp_path / "main.yaml"
    main_text = "# my comments\n" + yaml.safe_dump(
        {"tenants_file": "tenants.yaml", "pools": [{**POOL, "workers": ["http://127.0.0.1:9"]}]})
    main.write_text(main_text)
    third = add_key(main, "beta")
    assert main.read_text() == main_text
    assert load_config(main).tenants[0].api_key_sha256 == (hash_api_key(third),)


def test_authorize_enforces_models_cap_and_pins() -> None:
    tenant = parse_config({"pools": [{**POOL, "workers": ["http://127.0.0.1:9"]}],
                           "tenants": [{"name": "t", "models": ["m"], "max_tokens": 64}]}
                          ).tenants[0]
    request = parse_request({"model": "m", "prompt": "x"}, "completions")
    authorize(tenant, request, Pin())
    assert request.max_tokens == 64 and request.body["max_tokens"] == 64
    with pytest.raises(InvalidRequest, match="cap of 64"):
        authorize(tenant, parse_request({"model": "m", "prompt": "x", "max_tokens": 65},
                                        "completions"), Pin())
    with pytest.raises(ModelNotFound):
        authorize(tenant, parse_request({"model": "other", "prompt": "x"}, "completions"),
                  Pin())
    for pin in (Pin(pool="p"), Pin(k=2)):
        with pytest.raises(PermissionDenied) as info:
            authorize(tenant, parse_request({"model": "m", "prompt": "x"}, "completions"), pin)
        assert info.value.status == 403
    authorize(tenant, parse_request({"model": "m", "prompt": "x"}, "completions"),
              Pin(benchmark=True))  # marking traffic is no pin


async def test_sighup_reloads_tenants(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"pools": [{**POOL, "workers": ["http://127.0.0.1:9"]}],
                                    "tenants": [{"name": "a"}]}))
    installed: list[Authenticator] = []
    reloader = TenantReloader(path, installed.append, required=True, interval_s=3600)
    reloader.start()
    try:
        add_key(path, "b")
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(100):
            if installed:
                break
            await asyncio.sleep(0.05)
        assert installed and set(installed[-1].by_name) == {"a", "b"}
        # a file that lists no tenant would open the gateway: the old tenants stay
        path.write_text(yaml.safe_dump({"pools": [{**POOL, "workers": ["http://127.0.0.1:9"]}]}))
        assert not await reloader.reload()
        path.write_text("pools: [")  # broken YAML: kept too
        assert not await reloader.reload()
        await reloader._tick()  # and the file watch goes on
        assert reloader.loop._task is not None and not reloader.loop._task.done()
    finally:
        await reloader.stop()


def test_http_401_403_429_and_reload_of_a_new_key(tmp_path: Path) -> None:
    stub, worker = start_stub(tmp_path, "stub", "--model", "m", "--drip", "0.3")
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config_with(worker, tenants=[
        {"name": "a", "api_key_sha256": [hash_api_key(KEY)], "rate_limit_rpm": 3}])))
    proc, url = start_cli_gateway(tmp_path, path)
    try:
        if WINDOW_S - time.time() % WINDOW_S < 30:  # keep tenant a's requests in one window
            time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.5)
        assert chat(url, None).status_code == 401
        assert chat(url, "sk-wrong").json()["error"]["code"] == "invalid_api_key"
        pinned = httpx.post(url + "/v1/chat/completions", timeout=10, json={
            "model": "m", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {KEY}", "x-specroute-pool": "p"})
        assert pinned.status_code == 403 and pinned.json()["error"]["code"] == "pin_not_allowed"
        # a stream in flight with the key survives the reload that removes that key
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=30,
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": "m", "stream": True, "max_tokens": 8, "messages": [
                              {"role": "user", "content": "a b c d e f g h"}]}) as stream:
            assert stream.status_code == 200
            new_key = add_key(path, "b")
            raw = yaml.safe_load(path.read_text())
            raw["tenants"] = [t for t in raw["tenants"] if t["name"] == "b"]
            path.write_text(yaml.safe_dump(raw))
            body = b"".join(stream.iter_bytes())
        assert body.rstrip().endswith(b"data: [DONE]") and b'"error"' not in body
        deadline = time.monotonic() + 15
        while chat(url, new_key).status_code == 401 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert chat(url, new_key).status_code == 200
        assert chat(url, KEY).status_code == 401  # removed by the reload
        # 429 with Retry-After: tenant a's limit (3 a minute) counted its requests above
        path.write_text(yaml.safe_dump(config_with(worker, tenants=[
            {"name": "a", "api_key_sha256": [hash_api_key(KEY)], "rate_limit_rpm": 3}])))
        deadline = time.monotonic() + 15
        while chat(url, KEY).status_code == 401 and time.monotonic() < deadline:
            time.sleep(0.2)
        limited = chat(url, KEY)
        assert limited.status_code == 429, limited.text
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(limited.headers["retry-after"]) <= WINDOW_S
    finally:
        stop_process(proc)
        stop_process(stub)


def test_two_gateways_on_one_redis_enforce_one_limit(tmp_path: Path, redis_url: str) -> None:
    stub, worker = start_stub(tmp_path, "stub", "--model", "m")
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(config_with(worker, redis_url=redis_url, tenants=[
        {"name": "a", "api_key_sha256": [hash_api_key(KEY)], "rate_limit_rpm": 5}])))
    procs = []
    try:
        first = start_cli_gateway(tmp_path, path, "gw1")
        procs.append(first[0])
        second = start_cli_gateway(tmp_path, path, "gw2")
        procs.append(second[0])
        if WINDOW_S - time.time() % WINDOW_S < 15:
            time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.5)
        statuses = [chat(url, KEY).status_code for _ in range(4) for url in (first[1], second[1])]
        assert statuses.count(200) == 5, statuses  # one limit of 5, not 5 per replica
        assert statuses.count(429) == 3
    finally:
        for proc in procs:
            stop_process(proc)
        stop_process(stub)


async def test_token_limit_in_redis_and_when_redis_is_down(redis_url: str) -> None:
    tenant = parse_config({"pools": [{**POOL, "workers": ["http://127.0.0.1:9"]}], "tenants": [
        {"name": "t", "rate_limit_tpm": 100}]}).tenants[0]
    now = [WINDOW_S * 1000.0]
    shared, other = (Limits(redis_url, clock=lambda: now[0]) for _ in range(2))
    await shared.admit(tenant)
    shared.spend(tenant, 100)  # prompt + completion tokens of the finished request
    await asyncio.gather(*shared.pending)
    with pytest.raises(RateLimited) as info:
        await other.admit(tenant)  # the other replica sees the tokens spent
    assert info.value.code == "token_limit_exceeded" and info.value.retry_after_s == WINDOW_S
    now[0] += WINDOW_S
    await other.admit(tenant)  # the next window
    await shared.close()
    await other.close()
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    closed = Limits(dead, on_redis_error="closed", clock=lambda: now[0])
    with pytest.raises(LimiterUnavailable) as down:
        await closed.admit(tenant)
    assert down.value.status == 503 and down.value.retry_after_s > 0
    with pytest.raises(LimiterUnavailable):  # while Redis is marked down, without asking it
        await closed.admit(tenant)
    await closed.close()
    opened = Limits(dead, on_redis_error="open", clock=lambda: now[0])
    await opened.admit(tenant)  # counted in this process instead
    opened.spend(tenant, 100)
    with pytest.raises(RateLimited):
        await opened.admit(tenant)
    await opened.close()
