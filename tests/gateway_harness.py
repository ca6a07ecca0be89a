"""Real processes for the routing and failover tests: stub workers and a gateway whose
policy is chosen by name (learned, static or first), with the gateway's log level."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml
from conftest import free_port, free_ports, start_process, stop_process, wait_http

GATEWAY_MAIN = """
import logging
import sys
import uvicorn
from gateway.http.app import create_app
from gateway.config import load_config
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
uvicorn.run(create_app(load_config(sys.argv[1]), policy=sys.argv[3]), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="info", access_log=False)
"""


def start_stub(tmp: Path, name: str, *args: str, port: int | None = None,
               script: str = "tests/sglang_stub.py") -> tuple[subprocess.Popen, str]:
    port = port or free_port()
    proc = start_process([script, "--port", str(port), *args], tmp / f"{name}.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/health", 20, proc)
    return proc, url


def start_worker(tmp: Path, method: str, model: Path | str, name: str = "worker"
                 ) -> tuple[subprocess.Popen, str]:
    """An embedded worker (`specroute worker`, one torch thread) serving `model` with
    `method`, logging to tmp/{name}.log; returns once /health answers."""
    port = free_port()
    proc = start_process(["-m", "specroute.cli", "worker", "--method", method, "--port",
                          str(port), "--model", str(model), "--threads", "1"],
                         tmp / f"{name}.log")
    return proc, healthy(proc, port, 60)


def start_stubs(tmp: Path, specs: dict[str, list[str]],
                script: str = "tests/sglang_stub.py"
                ) -> tuple[dict[str, subprocess.Popen], dict[str, str]]:
    """Several stubs started at once (then waited for); name -> extra arguments."""
    ports = dict(zip(specs, free_ports(len(specs)), strict=True))
    procs = {name: start_process([script, "--port", str(ports[name]), *args],
                                 tmp / f"{name}.log") for name, args in specs.items()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    try:
        for name, proc in procs.items():
            wait_http(urls[name] + "/health", 20, proc)
    except BaseException:
        for proc in procs.values():
            stop_process(proc)
        raise
    return procs, urls


def start_gateway(tmp: Path, config: dict, policy: str = "first",
                  name: str = "gateway", port: int | None = None, env: dict | None = None,
                  script: str = GATEWAY_MAIN) -> tuple[subprocess.Popen, str]:
    """`script` (run as `python -c script CONFIG PORT POLICY`) serving `config`, logging
    to tmp/{name}.log; returns once /health answers (stopped if it never does). Unless
    the config says otherwise, a loopback caller is admin (`server.loopback_admin`): the
    tests read /ready's worker detail."""
    config = {**config, "server": {"loopback_admin": True, **config.get("server", {})}}
    port = port or free_port()
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = start_process(["-c", script, str(path), str(port), policy],
                         tmp / f"{name}.log", env=env)
    return proc, healthy(proc, port, 30)


@contextmanager
def gateway_over(tmp: Path, config: dict, procs: dict[str, subprocess.Popen]) -> Iterator[str]:
    """A gateway (`start_gateway`, name "gw") in front of the stub `procs`; yields its URL.
    On the way out, or if it never starts, it and every stub are stopped (a stub a test
    paused with SIGSTOP is resumed first, so that it can exit)."""
    try:
        gw, url = start_gateway(tmp, config, name="gw")
    except BaseException:
        for proc in procs.values():
            stop_process(proc)
        raise
    try:
        yield url
    finally:
        stop_process(gw)
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            stop_process(proc)


def stats(url: str) -> dict:
    return httpx.get(url + "/stats", timeout=2).json()


def worker_states(gateway: str, pool: str) -> list[dict]:
    return httpx.get(gateway + "/ready", timeout=2).json()["pools"][pool]["worker_states"]


def healthy(proc: subprocess.Popen, port: int, timeout_s: float) -> str:
    """The process's URL once /health answers; the process is stopped if it never does."""
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", timeout_s, proc)
    except BaseException:
        stop_process(proc)
        raise
    return url
