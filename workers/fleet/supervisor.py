"""Run one pool's inference server and relaunch it when the policy wants another k.

SGLang and vLLM fix the speculation depth at launch, so a per-pool change of k means a
restart. The policy publishes the pool's wish in Redis (`policies.keys.desired_k_key`,
a decimal string); the supervisor applies it when it is worth it:

    desired k read -> equal to current k, or last launch < min interval ago? keep
                   -> the model's restart lock (`workers.fleet.restart_lock`) or keep
                   -> raise drain flag -> wait for in-flight requests (or a grace time)
                   -> stop the server -> launch with the new k -> wait for /health
                   -> re-register with the new k -> clear drain flag

A server that exits on its own is restarted with exponential backoff. A start that
neither serves nor exits within `health_timeout_s` is killed and tried again at the same
k (`start_attempts`) before that k is given up (a vLLM CPU relaunch once logged
nothing for 6 minutes in CI). `Supervisor` does one unit of work per `poll_once()` call;
`workers.fleet.service.supervise()` is the blocking loop behind `specroute supervise`.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import redis

from policies.fleet import FleetPool
from policies.keys import desired_k_key
from workers.fleet.launch import CommandBuilder
from workers.fleet.registry import Registration, new_worker_info
from workers.fleet.restart_lock import restart_lock

logger = logging.getLogger(__name__)


class SupervisorError(RuntimeError):
    """The config is unusable, or the server could not be launched or never became healthy."""


class StartTimeout(SupervisorError):
    """The server neither became healthy nor exited within `health_timeout_s`."""


def advertised_url(pool: FleetPool, port: int | None, override: str | None) -> tuple[str, int]:
    """(URL gateways use, port the server listens on): the override, else the pool's
    worker URL with that port, else the first worker URL, else 127.0.0.1."""
    if override:
        return override.rstrip("/"), port or urlsplit(override).port or 30000
    for url in pool.workers:
        if port is None or urlsplit(url).port == port:
            return url.rstrip("/"), urlsplit(url).port or 80
    return f"http://127.0.0.1:{port or 30000}", port or 30000


DEFAULT_START_TIMEOUT_S = 900.0  # SGLang loads weights and captures CUDA graphs first


@dataclass(frozen=True, slots=True)
class SupervisorSettings:
    url: str  # the server's base URL as gateways reach it (registered under this)
    port: int
    min_relaunch_interval_s: float = 30.0
    health_timeout_s: float = DEFAULT_START_TIMEOUT_S
    start_attempts: int = 2  # starts at one k that time out before the k is given up
    drain_notice_s: float = 3.0  # > gateway discovery_interval_s (2 s): it sees the flag
    drain_timeout_s: float = 120.0
    drain_grace_s: float = 10.0  # wait used when the server does not report its load
    poll_interval_s: float = 1.0
    restart_backoff_s: float = 1.0
    restart_backoff_max_s: float = 60.0
    registration_ttl_s: float = 10.0
    stop_timeout_s: float = 30.0
    log_path: Path | None = None  # child stdout/stderr; None = inherit


_LOAD_LINE = re.compile(r"^(?:sglang[:_](?:num_running_reqs|num_queue_reqs)|"
                        r"vllm[:_](?:num_requests_running|num_requests_waiting))"
                        r"(\{[^}]*\})?\s+(\S+)", re.MULTILINE)


def in_flight_requests(base_url: str, client: httpx.Client) -> int | None:
    """Running + queued requests, from /metrics (SGLang: sglang:num_running_reqs +
    sglang:num_queue_reqs, needs --enable-metrics; vLLM: vllm:num_requests_running +
    vllm:num_requests_waiting) or /server_info; None if unknown."""
    try:
        resp = client.get(f"{base_url}/metrics")
        if resp.status_code == 200:
            values = [float(m.group(2)) for m in _LOAD_LINE.finditer(resp.text)]
            if values:
                return int(sum(values))
        resp = client.get(f"{base_url}/server_info")
        if resp.status_code == 200:
            info = resp.json()
            states = [info, *(info.get("internal_states") or [])]
            counts = [s.get(name) for s in states if isinstance(s, dict)
                      for name in ("num_running_reqs", "num_queue_reqs", "num_waiting_reqs")]
            known = [int(c) for c in counts if isinstance(c, int | float)]
            if known:
                return sum(known)
    except (httpx.HTTPError, ValueError):
        return None
    return None


def group_snapshot(pgid: int) -> str:
    """Group `pgid`'s processes as `pid state wchan command`: what a hung start waits on."""
    rows = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # after ')': state, ppid, pgrp, ...
                continue
            wchan = (stat.parent / "wchan").read_text() or "-"
            command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ")[:120]
        except (OSError, IndexError, ValueError):
            continue  # it exited while we looked
        rows.append(f"{stat.parent.name} {fields[0]} {wchan} {command.decode(errors='replace')}")
    return "; ".join(sorted(rows)) or "none"


class Supervisor:
    """Owns one server process and its registration for one pool."""

    def __init__(self, pool: FleetPool, redis_url: str, build_command: CommandBuilder,
                 settings: SupervisorSettings, stopping: threading.Event | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.redis_url = redis_url
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=5.0)
        self._http = httpx.Client(timeout=httpx.Timeout(2.0))
        self._build_command = build_command
        self._stopping = stopping or threading.Event()
        self.process: subprocess.Popen[bytes] | None = None
        self.registration: Registration | None = None
        self.k = pool.k
        self.launches = 0
        self._launched_at = 0.0
        self._backoff = settings.restart_backoff_s
        self._restart_at: float | None = None
        self._rejected_k: int | None = None  # a k that failed to come up: not retried

    # -- process ---------------------------------------------------------------------
    def _spawn(self, k: int) -> None:
        argv = self._build_command(self.settings.port, k)
        logger.info("pool %s: launching k=%d: %s", self.pool.name, k, shlex.join(argv))
        out = open(self.settings.log_path, "ab") if self.settings.log_path else None  # noqa: SIM115
        try:
            # own session: SGLang forks scheduler/detokenizer children; we stop the group
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT if out
                                            else None, start_new_session=True)
        except OSError as exc:
            raise SupervisorError(f"cannot start {argv[0]!r}: {exc}") from exc
        finally:
            if out is not None:
                out.close()
        self.launches += 1
        self._launched_at = time.monotonic()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.settings.health_timeout_s
        while time.monotonic() < deadline and not self._stopping.is_set():
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise SupervisorError(f"server exited with {code} before it was healthy")
            try:
                if self._http.get(f"{self.settings.url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            self._stopping.wait(0.2)
        if self._stopping.is_set():  # told to stop while it was starting: not a failure
            raise SupervisorError(f"stopping before {self.settings.url} was healthy")
        raise StartTimeout(f"{self.settings.url}/health not ready in "
                           f"{self.settings.health_timeout_s:.0f}s")

    def _terminate(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(self.settings.stop_timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("pool %s: server ignored SIGTERM, killing", self.pool.name)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            proc.wait()
        self._reap_group(proc.pid)

    def _reap_group(self, pgid: int) -> None:
        """Kill what the server left behind in its process group. vLLM's API server can
        exit while its engine core and worker processes still run (a worker was seen
        spinning on its core for minutes after its server stopped, which starved the
        relaunched server bound to the same core), so the group is waited on and then
        SIGKILLed, not only its leader."""
        deadline = time.monotonic() + min(self.settings.stop_timeout_s, 10.0)
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        logger.warning("pool %s: the server's children outlived it, killing them", self.pool.name)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _launch(self, k: int) -> None:
        """Start the server with `k`, wait for /health, announce it."""
        for attempt in range(1, self.settings.start_attempts + 1):
            self._spawn(k)
            try:
                self._wait_healthy()
                break
            except StartTimeout as exc:
                assert self.process is not None
                logger.warning("pool %s: k=%d start hung; its processes: %s", self.pool.name,
                               k, group_snapshot(self.process.pid))
                self._terminate()
                if attempt == self.settings.start_attempts:
                    raise
                logger.warning("pool %s: k=%d start hung (%s); starting it again",
                               self.pool.name, k, exc)
            except SupervisorError:
                self._terminate()
                raise
        self.k = k
        assert self.process is not None
        if self.registration is None:
            info = new_worker_info(self.settings.url, self.pool.name, self.pool.engine,
                                   self.pool.method, k, self.pool.model, self.process.pid,
                                   self.pool.measured_document())
            self.registration = Registration(self.redis_url, info,
                                             self.settings.registration_ttl_s).start()
        else:
            self.registration.update(k=k, pid=self.process.pid, started_at=time.time())
        logger.info("pool %s: serving at %s with k=%d", self.pool.name, self.settings.url, k)

    # -- public ----------------------------------------------------------------------
    def start(self) -> None:
        """First launch, with the desired k when the policy has already published one."""
        desired = self.desired_k()
        self.k = desired if desired is not None else self.pool.k
        try:
            self._launch(self.k)
        except SupervisorError as exc:  # poll_once restarts it with backoff
            logger.error("pool %s: first launch failed: %s", self.pool.name, exc)

    def desired_k(self) -> int | None:
        try:
            raw = self._redis.get(desired_k_key(self.pool.name))
        except redis.RedisError as exc:
            logger.warning("pool %s: cannot read desired k: %s", self.pool.name, exc)
            return None
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            logger.warning("pool %s: ignoring desired k %r", self.pool.name, raw)
            return None
        return value if value >= 0 else None

    def poll_once(self) -> str:
        """One supervision step; returns what it did (for logs and tests):
        'restarted', 'backoff', 'relaunched', 'held', 'failed', or 'idle'."""
        if self.process is None or self.process.poll() is not None:
            return self._restart_crashed()
        desired = self.desired_k()
        if desired is None or desired == self.k or desired == self._rejected_k:
            return "idle"
        if time.monotonic() - self._launched_at < self.settings.min_relaunch_interval_s:
            return "held"
        with restart_lock(self._redis, self.pool.model,
                          {"url": self.settings.url, "pool": self.pool.name, "k": desired}) as held:
            return self.relaunch(desired) if held else "held"

    def relaunch(self, k: int) -> str:
        """Drain, stop, start with `k`; on failure go back to the previous k."""
        previous = self.k
        logger.info("pool %s: relaunching k %d -> %d", self.pool.name, previous, k)
        self._set_draining(True)
        self._wait_drained()
        self._terminate()
        try:
            self._launch(k)
            outcome = "relaunched"
        except SupervisorError as exc:
            logger.error("pool %s: k=%d did not come up (%s); back to k=%d",
                         self.pool.name, k, exc, previous)
            self._rejected_k = k
            outcome = "failed"
            try:
                self._launch(previous)
            except SupervisorError as again:  # poll_once restarts it with backoff
                logger.error("pool %s: k=%d failed too: %s", self.pool.name, previous, again)
                return outcome
        self._set_draining(False)
        return outcome

    def assign(self, pool: FleetPool, build_command: CommandBuilder) -> None:
        """Serve as `pool` from the next launch on (before `start`: the desired fleet's)."""
        self.pool, self._build_command, self.k = pool, build_command, pool.k

    def move_to(self, pool: FleetPool, build_command: CommandBuilder) -> str:
        """Change pool (another method and k): drain, stop, deregister from the old pool,
        launch as `pool`, register there. A launch that fails rolls back to the old
        pool, method and k. Returns 'moved' or 'failed'."""
        old = (self.pool, self._build_command, self.k)
        logger.info("pool %s: moving to pool %s (%s k=%d)", self.pool.name, pool.name,
                    pool.method, pool.k)
        self._set_draining(True)
        self._wait_drained()
        self._terminate()
        if self.registration is not None:
            self.registration.stop()
            self.registration = None
        self.pool, self._build_command = pool, build_command
        try:
            self._launch(self.desired_k() or pool.k)  # the new pool's k when one is wished
            return "moved"
        except SupervisorError as exc:
            logger.error("pool %s did not come up (%s); back to pool %s", pool.name, exc,
                         old[0].name)
            self.pool, self._build_command = old[0], old[1]
            try:
                self._launch(old[2])
            except SupervisorError as again:  # poll_once restarts it with backoff
                logger.error("pool %s failed too: %s", old[0].name, again)
            return "failed"

    def _restart_crashed(self) -> str:
        now = time.monotonic()
        if self._restart_at is None:
            code = None if self.process is None else self.process.returncode
            logger.warning("pool %s: server exited (%s); restart in %.1fs",
                           self.pool.name, code, self._backoff)
            self._restart_at = now + self._backoff
            self._set_draining(True)
        if now < self._restart_at:
            return "backoff"
        self._restart_at = None
        try:
            self._launch(self.k)
        except SupervisorError as exc:
            logger.error("pool %s: restart failed: %s", self.pool.name, exc)
            self._backoff = min(self._backoff * 2, self.settings.restart_backoff_max_s)
            return "backoff"
        self._backoff = self.settings.restart_backoff_s
        self._set_draining(False)
        return "restarted"

    def _set_draining(self, draining: bool) -> None:
        if self.registration is None:
            return
        try:
            self.registration.set_draining(draining)
        except redis.RedisError as exc:
            logger.warning("pool %s: cannot set drain flag: %s", self.pool.name, exc)

    def _wait_drained(self, stopping: threading.Event | None = None) -> None:
        stopping = stopping or self._stopping
        stopping.wait(self.settings.drain_notice_s)
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while time.monotonic() < deadline and not stopping.is_set():
            busy = in_flight_requests(self.settings.url, self._http)
            if busy is None:
                stopping.wait(min(self.settings.drain_grace_s,
                                  max(deadline - time.monotonic(), 0)))
                return
            if busy == 0:
                return
            stopping.wait(0.2)
        logger.warning("pool %s: drain timed out; stopping with requests in flight",
                       self.pool.name)

    def stop(self, drain: bool = False) -> None:
        """Deregister, stop the server, close clients; with `drain`, first let requests in
        flight finish (SIGTERM: Kubernetes scaling the pool down, or a stop by hand)."""
        if drain and self.process is not None and self.process.poll() is None:
            self._set_draining(True)
            self._wait_drained(threading.Event())  # not cut short: stopping is what this is
        if self.registration is not None:
            self.registration.stop()
            self.registration = None
        self._terminate()
        self._http.close()
        self._redis.close()
