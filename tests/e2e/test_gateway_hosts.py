"""Local safety through `specroute gateway` (the real serve path, uvicorn, a stub worker):
a request naming a host the gateway does not serve (DNS rebinding: a web page's script
reaching 127.0.0.1 under the attacker's name) is a 421 before it reaches any route, the
token routes' front door included; a loopback caller is no admin unless the config says
so (`server.loopback_admin`)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import free_port, start_process, stop_process, wait_http
from gateway_harness import healthy, start_stubs, stats
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.http.hosts import HostAllowlist, host_name


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    tmp: Path = tmp_path_factory.mktemp("hosts")
    procs, urls = start_stubs(tmp, {"w": ["--model", "m", "--method", "plain", "--k", "0"]})
    port = free_port()
    path = tmp / "gateway.yaml"  # the defaults: loopback names only, no loopback admin
    path.write_text(yaml.safe_dump({"pools": [{"name": "p", "engine": "sglang", "k": 0,
                                               "method": "plain", "model": "m",
                                               "workers": [urls["w"]]}]}))
    gateway = start_process(["-m", "specroute.cli", "gateway", "--config", str(path),
                             "--port", str(port), "--policy", "first"], tmp / "gw.log")
    try:
        url = healthy(gateway, port, 60)
        yield {"url": url, "port": port, "worker": urls["w"]}
    finally:
        stop_process(gateway)
        stop_process(procs["w"])


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
def test_loopback_names_are_served(stack: dict, host: str) -> None:
    response = httpx.get(stack["url"] + "/health", headers={"Host": f"{host}:{stack['port']}"})
    assert response.status_code == 200


@pytest.mark.parametrize("host", ["attacker.example", "localhost.attacker.example",
                                  "127.0.0.1.nip.io", "192.168.1.10"])
def test_a_foreign_host_is_refused_on_every_route(stack: dict, host: str) -> None:
    headers = {"Host": f"{host}:{stack['port']}"}
    before = stats(stack["worker"])["generate_calls"]
    for response in (httpx.get(stack["url"] + "/ready", headers=headers),
                     httpx.get(stack["url"] + "/console", headers=headers),
                     httpx.post(stack["url"] + "/v1/chat/completions", json=CHAT,
                                headers=headers)):
        assert response.status_code == 421, response.text
        assert response.json()["error"]["code"] == "host_not_allowed"
    assert stats(stack["worker"])["generate_calls"] == before
    served = httpx.post(stack["url"] + "/v1/chat/completions", json=CHAT)
    assert served.status_code == 200, served.text


def test_a_request_without_host_is_refused(stack: dict) -> None:
    with socket.create_connection(("127.0.0.1", stack["port"]), timeout=5) as conn:
        conn.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 421 ")


def test_loopback_is_no_admin_by_default(stack: dict) -> None:
    ready = httpx.get(stack["url"] + "/ready")
    assert ready.status_code == 200 and ready.json() == {"ready": True, "models_ready": {"m": True}}  # no pool detail
    assert httpx.get(stack["url"] + "/v1/console/state").status_code == 403


def test_the_bound_address_is_served(stack: dict, tmp_path: Path) -> None:
    """Bound to another loopback address, the gateway answers a client that names it."""
    port = free_port()
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump({"pools": [{"name": "p", "engine": "sglang", "k": 0,
                                               "method": "plain", "model": "m",
                                               "workers": [stack["worker"]]}]}))
    gateway = start_process(["-m", "specroute.cli", "gateway", "--config", str(path), "--host",
                             "127.0.0.2", "--port", str(port), "--policy", "first"],
                            tmp_path / "gw2.log")
    try:
        wait_http(f"http://127.0.0.2:{port}/health", 60, gateway)
        assert httpx.get(f"http://127.0.0.2:{port}/ready").status_code == 200
    finally:
        stop_process(gateway)


def test_host_patterns() -> None:
    assert host_name("[::1]:8000") == "::1" and host_name("Example.COM:80") == "example.com"
    assert host_name("::1") == "::1" and host_name("") == ""
    allow = HostAllowlist(Starlette(), ["api.example.com", "*.internal"])
    assert allow.allows("api.example.com") and allow.allows("gw.internal")
    assert not allow.allows("internal") and not allow.allows("example.com")
    assert not allow.allows("")

    async def hello(request: object) -> PlainTextResponse:
        return PlainTextResponse("hello")

    wrapped = HostAllowlist(Starlette(routes=[Route("/", hello)]), ["*"])
    with TestClient(wrapped, base_url="http://anything.example") as client:
        assert client.get("/").text == "hello"
