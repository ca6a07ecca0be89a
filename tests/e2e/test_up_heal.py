"""`specroute up` heals itself: a worker SIGKILLed under traffic is restarted (with
backoff, and says so) while the gateway's failover serves its requests on the other
pool; the stack keeps running, and a signal still stops every process, the restarted
one included. Runs the bundled model (`--model tiny`), as tests/e2e/test_up.py does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
from conftest import free_port, start_process, wait_http

from tests.e2e.test_up import (
    MODEL_ARG,
    assert_stops_cleanly,
    children_of,
    kill_stack,
    needs_model,
)
from workers.processes import Child, Restarts


def child(name: str, started: float) -> Child:
    return Child(name, None, Path("x.log"), [], started)  # type: ignore[arg-type]


def test_restart_backoff_doubles_and_starts_over_once_stable() -> None:
    restarts = Restarts(base_s=1, max_s=8, stable_s=60)
    delays = [restarts.delay(child("w", 100.0), 101.0) for _ in range(5)]
    assert delays == [1, 2, 4, 8, 8]
    assert restarts.in_a_row["w"] == 5
    # a child that stayed up a minute is restarted at once again
    assert restarts.delay(child("w", 100.0), 170.0) == 1
    assert restarts.total["w"] == 6
    # each child has its own count
    assert restarts.delay(child("other", 0.0), 1.0) == 1


def worker_pid(up_pid: int, method: str) -> int:
    for pid in children_of(up_pid):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"worker" in args and method.encode() in args:
            return pid
    raise LookupError(f"no worker for {method}")


class Traffic(threading.Thread):
    """Non-streaming chat requests in a loop until stopped; counts outcomes."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.ok, self.failed = url, threading.Event(), 0, []

    def run(self) -> None:
        body = {"model": "specroute-tiny", "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "Say hello."}]}
        with httpx.Client(base_url=self.url, timeout=60) as client:
            while not self.stop.is_set():
                try:
                    response = client.post("/v1/chat/completions", json=body)
                except httpx.HTTPError as exc:
                    self.failed.append(repr(exc))
                    continue
                if response.status_code == 200:
                    self.ok += 1
                else:
                    self.failed.append(f"{response.status_code} {response.text[:200]}")


@needs_model
def test_a_killed_worker_is_restarted_while_failover_serves_its_traffic(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start_process(["-m", "specroute.cli", "up", "--port", str(port), "--workdir",
                          str(tmp_path / "work"), "--methods", "plain,ngram", "--model",
                          MODEL_ARG], tmp_path / "up.log", env={"REDIS_URL": ""})
    pids: set[int] = set()
    clients = [Traffic(url) for _ in range(3)]
    try:
        wait_http(url + "/ready", 60, proc)
        victim = worker_pid(proc.pid, "ngram")  # plain pools are every request's fallback
        for client in clients:
            client.start()
        time.sleep(1.0)
        os.kill(victim, signal.SIGKILL)
        log = tmp_path / "up.log"
        deadline = time.monotonic() + 60
        while "worker-ngram restarted" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text()
        assert "worker-ngram exited with status -9; restarting in 1s (restart 1" in text
        assert "worker-ngram restarted" in text
        assert proc.poll() is None  # the stack is still up
        reborn = worker_pid(proc.pid, "ngram")
        assert reborn != victim
        # the gateway takes the restarted worker back once its probes pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = httpx.get(url + "/ready", timeout=5).json()["pools"]["embedded-ngram"]
            if state["healthy_workers"] == 1:
                break
            time.sleep(0.3)
        assert state["healthy_workers"] == 1, state
        served_before = sum(c.ok for c in clients)
        time.sleep(1.0)
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(60)
        assert sum(c.ok for c in clients) > served_before  # still serving after the heal
        assert [f for c in clients for f in c.failed] == []
        pids = children_of(proc.pid)
        assert len(pids) == 4 and reborn in pids
        assert_stops_cleanly(proc, pids)
    finally:
        for client in clients:
            client.stop.set()
        kill_stack(proc, pids)



def test_a_crash_loop_stops_the_stack(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """A child that dies at once, again and again, is restarted with backoff and then
    given up on: `heal` returns 1 (the stack stops) after GIVE_UP_AFTER deaths in a row."""
    import sys

    from specroute.stack import GIVE_UP_AFTER, heal
    from workers.processes import spawn

    crashing = spawn("worker-crash", [sys.executable, "-c", "raise SystemExit(3)"], tmp_path)
    children = [crashing]
    assert heal(children, tmp_path, Restarts(base_s=0.01, max_s=0.05), poll_s=0.05) == 1
    err = capsys.readouterr().err
    assert err.count("worker-crash exited with status 3; restarting") == GIVE_UP_AFTER - 1
    assert f"{GIVE_UP_AFTER} times in a row; stopping" in err
    assert children[0] is not crashing and children[0].proc.wait(5) == 3
