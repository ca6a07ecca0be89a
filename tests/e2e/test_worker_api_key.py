"""Model servers behind an API key: supervisors launch SGLang and vLLM with `--api-key`
from the fleet's Secret (`SPECROUTE_WORKER_API_KEY`), and the gateway's upstream client
sends it on every call to the pool's workers. A real HTTP stub enforcing the key as SGLang 0.5.23 does (health open,
everything else 401 without it) stands in for the server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port, start_process, stop_process
from gateway_harness import healthy, start_stubs

from gateway.config import parse_config, with_environment
from policies.fleet import FleetPool
from workers.fleet.launch import WORKER_API_KEY_ENV, command_builder

KEY = "worker-key-from-the-secret"


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_servers_launch_with_the_key(engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pool = FleetPool(name="p", engine=engine, method="plain", k=0, model="m",
                     model_path="/models/m")
    assert "--api-key" not in command_builder(pool, None)(30000, 0)
    monkeypatch.setenv(WORKER_API_KEY_ENV, KEY)
    argv = command_builder(pool, None)(30000, 0)
    assert argv[argv.index("--api-key") + 1] == KEY


def test_the_gateway_reads_its_secrets_from_the_environment() -> None:
    config = parse_config({"redis_url": "redis://redis:6379/0", "pools": [
        {"name": "p", "engine": "sglang", "model": "m", "workers": ["http://a:1"]},
        {"name": "q", "engine": "sglang", "model": "m", "workers": ["http://b:1"],
         "api_key": "its-own"}]})
    secret = with_environment(config, {WORKER_API_KEY_ENV: KEY, "REDIS_URL": "redis://:pw@r/0",
                                       "SPECROUTE_REGISTRY_SECRET": "s"})
    assert [p.api_key for p in secret.pools] == [KEY, "its-own"]
    assert secret.redis_url == "redis://:pw@r/0" and secret.server.registry_secret == "s"
    assert with_environment(config, {}) == config


def start_gateway_with(tmp: Path, name: str, worker: str, env: dict) -> tuple:
    """`specroute gateway` (the real serve path, secrets from its environment)."""
    port = free_port()
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"pools": [
        {"name": "p", "engine": "sglang", "method": "eagle", "k": 3, "model": "m",
         "workers": [worker]}]}))
    proc = start_process(["-m", "specroute.cli", "gateway", "--config", str(path), "--port",
                          str(port), "--policy", "first"], tmp / f"{name}.log", env=env)
    return proc, healthy(proc, port, 60)


def test_the_gateway_sends_the_key(tmp_path: Path) -> None:
    """Every route that reaches the worker carries the key: completions (SGLang's
    /generate), native /generate, and the /server_info fan-out; without the key the
    worker's 401 is what the client gets."""
    procs, urls = start_stubs(tmp_path, {"w": ["--model", "m", "--method", "eagle", "--k", "3",
                                               "--api-key", KEY]})
    worker = urls["w"]
    gateways = []
    try:
        assert httpx.get(worker + "/health").status_code == 200  # probes need no key
        assert httpx.post(worker + "/generate", json={"text": "a"}).status_code == 401
        keyed, url = start_gateway_with(tmp_path, "keyed", worker, {WORKER_API_KEY_ENV: KEY})
        gateways.append(keyed)
        completion = httpx.post(url + "/v1/completions", timeout=10,
                                json={"model": "m", "prompt": "hello there", "max_tokens": 2})
        assert completion.status_code == 200, completion.text
        native = httpx.post(url + "/generate", json={"text": "hello there"}, timeout=10)
        assert native.status_code == 200, native.text
        info = httpx.get(url + "/server_info", timeout=10).json()
        assert info["internal_states"][1]["pool"] == "p"  # the worker answered the fan-out
        bare, url = start_gateway_with(tmp_path, "bare", worker, {WORKER_API_KEY_ENV: ""})
        gateways.append(bare)
        refused = httpx.post(url + "/v1/completions", timeout=10,
                             json={"model": "m", "prompt": "hello there", "max_tokens": 2})
        assert refused.status_code == 401, refused.text
    finally:
        for proc in [*gateways, *procs.values()]:
            stop_process(proc)
