"""Run the gateway under uvicorn: uvloop, httptools, one worker process.

One worker because the gateway keeps per-process state (outstanding counts, health)
and scales out as replicas behind a load balancer, with shared state in Redis.
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
import signal
import sys

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.app import create_app
from gateway.auth import check_exposure
from gateway.config import ConfigError, ServerConfig, load_config


class HeadDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request's head. uvicorn
    times out a connection only while idle after a response: one that connects and
    sends nothing, or trickles its headers a byte at a time (slow loris), would be held
    forever. Set `head_timeout_s` on a subclass (`head_deadline_protocol`)."""

    head_timeout_s = 10.0
    head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
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


def uvicorn_options(server: ServerConfig) -> dict:
    """How the gateway runs under uvicorn; the tests start it the same way."""
    return {"loop": "uvloop", "http": head_deadline_protocol(server.header_timeout_s),
            "workers": 1, "log_level": server.log_level, "access_log": False,
            "timeout_keep_alive": server.keep_alive_timeout_s,
            "limit_concurrency": server.max_concurrency,
            "timeout_graceful_shutdown": server.drain_timeout_s}


def serve(config_path: str, host: str | None = None, port: int | None = None,
          policy: str = "learned") -> int:
    """Serve until interrupted; returns a process exit code (2 for a bad config).
    `policy` names the routing policy: learned, static or first (`gateway.learned`)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"specroute gateway: {exc}", file=sys.stderr)
        return 2
    host = host or config.server.host
    refusal = check_exposure(config, host)
    if refusal is not None:
        print(f"specroute gateway: {refusal}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(config, policy=policy, config_path=config_path)
    # uvicorn drains on SIGTERM/SIGINT, then raises the signal again under the handler
    # found at start: ignored, so that a drained gateway exits 0 rather than by the signal.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    uvicorn.run(app, host=host,
                port=config.server.port if port is None else port,
                **uvicorn_options(config.server))
    return 0
