"""Redis dies under a gateway running the learned policy: requests keep succeeding, and
telemetry resumes in the stream once Redis is back on the same port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from conftest import free_port, start_redis, stop_process
from gateway_harness import start_gateway, start_stubs

from policies.keys import STREAM_KEY


def stream_length(port: int) -> int:
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return client.xlen(STREAM_KEY)
    finally:
        client.close()


def wait_until(condition, timeout: float = 15.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


class Traffic:
    """Requests in a loop from a thread; counts outcomes."""

    def __init__(self, url: str) -> None:
        self.url, self.ok, self.failed = url, 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "one two three"}],
                "max_tokens": 8, "temperature": 0}
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                response = client.post(self.url + "/v1/chat/completions", json=body)
                if response.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append((response.status_code, response.text[:200]))
                time.sleep(0.01)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[dict]:
    port = free_port()
    holder = {"port": port, "proc": start_redis(port, tmp_path), "dir": tmp_path}
    yield holder
    stop_process(holder["proc"])


def test_requests_survive_a_redis_outage_and_telemetry_resumes(tmp_path: Path,
                                                               redis_port: dict) -> None:
    port = redis_port["port"]
    procs, urls = start_stubs(tmp_path, {
        "eagle": ["--model", "m", "--method", "eagle", "--k", "3"],
        "plain": ["--model", "m", "--method", "plain", "--k", "0"]})
    config = {"redis_url": f"redis://127.0.0.1:{port}/0",
              "server": {"health_interval_s": 0.5, "discovery_interval_s": 0.5},
              "pools": [{"name": name, "engine": "sglang", "method": name,
                         "k": 3 if name == "eagle" else 0, "model": "m", "workers": [url]}
                        for name, url in urls.items()]}
    try:
        procs["gateway"], gateway = start_gateway(tmp_path, config, policy="learned")
        wait_until(lambda: httpx.get(gateway + "/ready", timeout=2).status_code == 200)
        with Traffic(gateway) as traffic:
            wait_until(lambda: stream_length(port) >= 5)
            redis_port["proc"].kill()
            redis_port["proc"].wait(5)
            during = traffic.ok
            wait_until(lambda: traffic.ok >= during + 20)  # served with Redis gone
            time.sleep(1.0)  # past the store's backoff and the registry's read interval
            assert traffic.ok >= during + 20
            redis_port["proc"] = start_redis(port, redis_port["dir"])  # empty, same port
            wait_until(lambda: stream_length(port) > 0)  # the queued records drain
            resumed = stream_length(port)
            wait_until(lambda: stream_length(port) >= resumed + 5)  # and new ones follow
        assert traffic.failed == []
        assert traffic.ok > 30
        log = (tmp_path / "gateway.log").read_text()
        assert "Traceback" not in log, log[-2000:]
    finally:
        for proc in procs.values():
            stop_process(proc)
