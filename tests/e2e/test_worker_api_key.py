"""Model servers behind an API key: supervisors launch SGLang and vLLM with `--api-key`
from the fleet's Secret (`SPECROUTE_WORKER_API_KEY`), and the gateway's upstream client
sends it. A real HTTP stub enforcing the key as SGLang 0.5.23 does (health open,
everything else 401 without it) stands in for the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from gateway_harness import start_stubs

from gateway.config import DEFAULT_SERVER, PoolConfig, parse_config, with_environment
from gateway.errors import UpstreamRejected
from gateway.schemas import parse_request
from gateway.upstream.adapters.sglang import SGLangAdapter
from gateway.upstream.http1 import Http1Client
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
        {"name": "p", "engine": "sglang", "model": "m", "workers": ["http://a:1"]}]})
    secret = with_environment(config, {WORKER_API_KEY_ENV: KEY, "REDIS_URL": "redis://:pw@r/0",
                                       "SPECROUTE_REGISTRY_SECRET": "s"})
    assert secret.server.worker_api_key == KEY and secret.redis_url == "redis://:pw@r/0"
    assert secret.server.registry_secret == "s"
    assert with_environment(config, {}) == config


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp: Path = tmp_path_factory.mktemp("api-key")
    procs, urls = start_stubs(tmp, {"w": ["--model", "m", "--method", "plain", "--k", "0",
                                          "--api-key", KEY]})
    yield urls["w"]
    for proc in procs.values():
        proc.terminate()
        proc.wait(10)


async def test_the_gateway_client_sends_the_key(locked: str) -> None:
    assert httpx.get(locked + "/health").status_code == 200  # probes need no key
    assert httpx.post(locked + "/generate", json={"text": "a"}).status_code == 401
    pool = PoolConfig(name="p", engine="sglang", method="plain", k=0, model="m",
                      workers=(locked,))
    request = parse_request({"model": "m", "prompt": "hello there", "max_tokens": 2},
                            "completions")
    server = DEFAULT_SERVER
    without = Http1Client(server.connect_timeout_s, 5, 10)
    with pytest.raises(UpstreamRejected) as refused:
        await SGLangAdapter(without).generate(locked, request, pool, 0)
    assert refused.value.status == 401
    keyed = Http1Client(server.connect_timeout_s, 5, 10, api_key=KEY)
    result = await SGLangAdapter(keyed).generate(locked, request, pool, 0)
    assert result.text
    without.close()
    keyed.close()
