"""The serving layer: coalesced writes, the event-loop lag probe, and `--workers N`
processes behind one port."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import uvicorn
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from gateway.config import ServerConfig
from gateway.http.serve import CoalescingTransport, uvicorn_options
from gateway.telemetry.loop_lag import LoopLagProbe
from tests.conftest import free_ports, start_process, stop_process, wait_http


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 1) if name == "peername" else default


async def test_writes_of_one_loop_turn_leave_as_one() -> None:
    real = Recording()
    transport = CoalescingTransport(real, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert real.writes == []
    await asyncio.sleep(0)
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    transport.write(b"tail")
    transport.close()  # flushes before closing
    assert real.writes[-1] == b"tail" and real.closed
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)


def test_forwarded_headers_do_not_change_the_scope() -> None:
    """uvicorn as the gateway runs it passes the scope as the connection made it: an
    `X-Forwarded-For` from a local caller names no other client (and the middleware that
    would read it is not in a request's path)."""
    seen: list[dict] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        seen.append(scope)

    config = uvicorn.Config(app, **uvicorn_options(ServerConfig()))
    config.load()
    scope = {"type": "http", "client": ("127.0.0.1", 5), "scheme": "http",
             "headers": [(b"x-forwarded-for", b"10.9.8.7"), (b"x-forwarded-proto", b"https")]}
    asyncio.run(config.loaded_app(scope, None, None))
    assert seen[0]["client"] == ("127.0.0.1", 5) and seen[0]["scheme"] == "http"


async def test_loop_lag_probe_sees_a_blocked_loop_and_exports_it() -> None:
    registry = CollectorRegistry()
    probe = LoopLagProbe(registry, interval_s=0.005)
    probe.start()
    await asyncio.sleep(0.05)
    time.sleep(0.06)  # the loop is blocked: the probe's next wake-up is that late
    await asyncio.sleep(0.05)
    await probe.stop()
    summary = probe.summary()
    assert summary["max_s"] >= 0.05
    assert summary["samples"] >= 2
    text = generate_latest(registry).decode()
    assert "specroute_event_loop_lag_seconds_bucket" in text
    max_line = next(line for line in text.splitlines()
                    if line.startswith("specroute_event_loop_lag_max_seconds "))
    assert float(max_line.split()[1]) >= 0.05


def test_workers_share_one_port(tmp_path: Path) -> None:
    up_port, gw_port = free_ports(2)
    config = {"server": {"host": "127.0.0.1", "port": gw_port, "log_level": "warning"},
              "pools": [{"name": "bench", "engine": "sglang", "model": "bench",
                         "method": "eagle", "k": 3,
                         "workers": [f"http://127.0.0.1:{up_port}"]}]}
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    upstream = start_process(["-m", "bench.gateway.upstream", "--port", str(up_port)],
                             tmp_path / "upstream.log")
    gateway = start_process(["-m", "specroute.cli", "gateway", "--config", str(path),
                             "--workers", "2", "--policy", "static"], tmp_path / "gateway.log")
    try:
        wait_http(f"http://127.0.0.1:{up_port}/health", proc=upstream)
        wait_http(f"http://127.0.0.1:{gw_port}/ready", proc=gateway)
        children = Path(f"/proc/{gateway.pid}/task/{gateway.pid}/children").read_text().split()
        assert len(children) >= 2

        def ask() -> None:  # a new connection each: whichever process accepts it serves it
            with httpx.Client(base_url=f"http://127.0.0.1:{gw_port}") as client:
                answer = client.post("/v1/chat/completions", json={
                    "model": "bench", "messages": [{"role": "user", "content": "hi"}]})
                assert answer.status_code == 200, answer.text
                assert answer.json()["choices"][0]["message"]["content"]

        # The processes share one listening socket and race to accept: one idle process
        # can win every sequential connection, so send 8 at a time (while one process is
        # busy the other accepts) until a scrape, answered by one process, counts fewer
        # requests than were sent: another process served the rest. Bounded.
        sent, behind = 0, False
        with ThreadPoolExecutor(8) as pool:
            for _ in range(50):
                list(pool.map(lambda _: ask(), range(8)))
                sent += 8
                metrics = httpx.get(f"http://127.0.0.1:{gw_port}/metrics").text
                seen = sum(float(line.split()[-1]) for line in metrics.splitlines()
                           if line.startswith("specroute_requests_total{"))
                if seen < sent:
                    behind = True
                    break
        assert behind  # more than one process served
    finally:
        stop_process(gateway)
        stop_process(upstream)
