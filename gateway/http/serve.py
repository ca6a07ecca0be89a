"""Run the gateway under uvicorn: uvloop, httptools, one or more worker processes.

One process by default. `workers=N` (`specroute gateway --workers N`) runs N processes
under uvicorn's supervisor, which binds the socket once and restarts a worker that dies;
the kernel spreads connections among them. Each process keeps its own outstanding
counts, health view and breakers (as separate replicas would); what they learn is
shared only through Redis (`redis_url`: the learned policy's telemetry store), so N > 1
without Redis means N policies that each learn from a share of the traffic
(docs/GATEWAY.md, "Scaling across processes").
Connection limits come from `server` (docs/GATEWAY.md, "Limits and timeouts"): a head
deadline (below), the keep-alive timeout, and a cap on connections + requests in
progress; the body deadline is the app's own (`endpoints.read_body`).

SIGTERM (or Ctrl-C) drains: the listening socket closes (new connections are refused),
idle keep-alive connections close, requests in flight (streams included) get
`server.drain_timeout_s` to finish, then the rest are cancelled; the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.compiled import log_start
from gateway.config import ConfigError, GatewayConfig, ServerConfig, load_config, with_environment
from gateway.http.app import GatewayApp, create_app
from gateway.http.hosts import HostAllowlist
from gateway.tenants.auth import check_exposure


class CoalescingTransport:
    """A transport that sends what one event-loop turn wrote as one `write`.

    uvicorn writes a response's head and its body separately, so a small answer cost
    two send syscalls (and the client two wake-ups); here writes are gathered and
    flushed by a callback at the end of the turn (or at `close`), so head and body
    leave together. Everything else is the real transport's."""

    __slots__ = ("transport", "loop", "pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append(data)

    def flush(self) -> None:
        if not self.pending:
            return
        data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
        self.pending = []
        if not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request's head, writing
    through a `CoalescingTransport`. uvicorn times out a connection only while idle
    after a response: one that connects and sends nothing, or trickles its headers a
    byte at a time (slow loris), would be held forever. Set `head_timeout_s` on a
    subclass (`head_deadline_protocol`)."""

    head_timeout_s = 10.0
    head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        coalescing = CoalescingTransport(transport, self.loop)  # type: ignore[arg-type]
        super().connection_made(coalescing)  # type: ignore[arg-type]
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.head_deadline is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self.head_deadline = self.loop.call_later(self.head_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self.head_deadline is not None:
            self.head_deadline.cancel()
            self.head_deadline = None

    def _expired(self) -> None:
        self.head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def head_deadline_protocol(timeout_s: float) -> type[HeadDeadlineProtocol]:
    return type("HeadDeadlineProtocol", (HeadDeadlineProtocol,), {"head_timeout_s": timeout_s})


CONFIG_ENV = "SPECROUTE_GATEWAY_CONFIG"  # how `serve` tells its worker processes
POLICY_ENV = "SPECROUTE_GATEWAY_POLICY"
HOST_ENV = "SPECROUTE_GATEWAY_HOST"


def host_allowlist(app: GatewayApp, config: GatewayConfig, host: str) -> HostAllowlist:
    """The app behind `server.allowed_hosts`, plus the address it is bound to (a client
    dialling `127.0.0.2` names it; no DNS name an attacker owns is an address)."""
    return HostAllowlist(app, (*config.server.allowed_hosts, host))


def uvicorn_options(server: ServerConfig) -> dict:
    """How the gateway runs under uvicorn; the tests start it the same way. No proxy
    headers: nothing here reads the client's address or the scheme (who may see the
    console is decided by the address the connection arrived on, `scope["server"]`), so
    uvicorn's `X-Forwarded-*` middleware would be one more ASGI call a request for
    nothing, and one more header a caller could use to pass for another."""
    return {"loop": "uvloop", "http": head_deadline_protocol(server.header_timeout_s),
            "workers": 1, "log_level": server.log_level, "access_log": False,
            "proxy_headers": False,
            "timeout_keep_alive": server.keep_alive_timeout_s,
            "limit_concurrency": server.max_concurrency,
            "timeout_graceful_shutdown": server.drain_timeout_s}


def _logging(config: GatewayConfig) -> None:
    logging.basicConfig(level=config.server.log_level.upper(),
                        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")


def app_from_env() -> HostAllowlist:
    """The app of one worker process when `serve` runs several: uvicorn's supervisor
    spawns each process, which imports this by name (a spawned child cannot be handed a
    built app or a class made at run time)."""
    config_path = os.environ[CONFIG_ENV]
    config = with_environment(load_config(config_path), os.environ)
    _logging(config)
    HeadDeadlineProtocol.head_timeout_s = config.server.header_timeout_s  # this process's
    app = create_app(config, policy=os.environ.get(POLICY_ENV, "learned"),
                     config_path=config_path)
    return host_allowlist(app, config, os.environ.get(HOST_ENV, config.server.host))


def serve(config_path: str, host: str | None = None, port: int | None = None,
          policy: str = "learned", workers: int = 1) -> int:
    """Serve until interrupted; returns a process exit code (2 for a bad config).
    `policy` names the routing policy: learned, static or first (`gateway.routing.policy`);
    `workers` is the number of processes."""
    try:
        config = with_environment(load_config(config_path), os.environ)
    except ConfigError as exc:
        print(f"specroute gateway: {exc}", file=sys.stderr)
        return 2
    if workers < 1:
        print("specroute gateway: --workers must be at least 1", file=sys.stderr)
        return 2
    host = host or config.server.host
    refusal = check_exposure(config, host)
    if refusal is not None:
        print(f"specroute gateway: {refusal}", file=sys.stderr)
        return 2
    _logging(config)
    log_start(logging.getLogger("specroute.gateway"))  # compiled hot path, or pure Python
    bind: dict[str, Any] = {"host": host, "port": config.server.port if port is None else port}
    if workers == 1:
        app = create_app(config, policy=policy, config_path=config_path)
        # uvicorn drains on SIGTERM/SIGINT, then raises the signal again under the handler
        # found at start: ignored, so that a drained gateway exits 0 rather than by the
        # signal.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        uvicorn.run(host_allowlist(app, config, host), **bind,
                    **uvicorn_options(config.server))
        return 0
    if not config.redis_url and policy == "learned":
        logging.getLogger("specroute.gateway").warning(
            "%d worker processes without redis_url: each learns from its own share of the "
            "traffic only", workers)
    os.environ[CONFIG_ENV] = str(Path(config_path).resolve())
    os.environ[POLICY_ENV] = policy
    os.environ[HOST_ENV] = host
    options: dict[str, Any] = {**uvicorn_options(config.server), "workers": workers,
                               "http": f"{__name__}:HeadDeadlineProtocol", "factory": True}
    uvicorn.run(f"{__name__}:app_from_env", **bind, **options)
    return 0
