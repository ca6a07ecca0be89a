"""What the picker runs on: the routing core (`gateway.core.services.Core`, the same
services as the gateway's) without the data path — Envoy carries the bytes — plus what
naming endpoints to Envoy needs. `running(services)` starts them and stops them.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from gateway.classifier.minimal import Classify
from gateway.config import GatewayConfig
from gateway.core.services import Core, load_default_classifier
from gateway.picker.protocol import endpoint_of
from gateway.pools import Pool, Worker
from policies.protocol import DecideFn, Rule

log = logging.getLogger("specroute.picker")


class PickerServices(Core):
    """`Core`, a readiness flag, the endpoints named per request (`max_endpoints`: 1 for
    an ORIGINAL_DST cluster, which takes one ip:port; more for Envoy's override_host
    policy, which walks the list on retry) and the picked requests whose response an
    observer stream will read, by exchange key."""

    def __init__(self, config: GatewayConfig, *, policy: str = "learned",
                 decide: DecideFn | None = None, classify: Classify | None = None,
                 max_endpoints: int | None = None) -> None:
        super().__init__(config, policy=Rule(decide, "custom") if decide else policy,
                         classify=classify or load_default_classifier())
        self.started = False  # the first health round has run (`running`)
        self.max_endpoints = max_endpoints or config.server.max_attempts
        self.exchanges: dict[str, Any] = {}

    def worker_at(self, endpoint: str) -> tuple[Pool, Worker] | None:
        """The pool and worker behind an `ip:port` (a handful of pools: a scan is fine)."""
        for pool in self.pools.values():
            for worker in pool.workers:
                if endpoint_of(worker.url) == endpoint:
                    return pool, worker
        return None

    @property
    def ready(self) -> bool:
        """Readiness: the first health round has run and some worker is available."""
        return self.started and any(
            pool.up_workers for pool in self.pools.values())


def build(config: GatewayConfig, *, policy: str = "learned", decide: DecideFn | None = None,
          classify: Classify | None = None, max_endpoints: int | None = None
          ) -> PickerServices:
    """The services, not started (no session, no tasks): `running` starts them; unit
    tests use them as they are. Blocking (the classifier's model loads here)."""
    return PickerServices(config, policy=policy, decide=decide, classify=classify,
                          max_endpoints=max_endpoints)


@contextlib.asynccontextmanager
async def running(services: PickerServices, config_path: str | None = None
                  ) -> AsyncIterator[PickerServices]:
    """Probe, discover and learn while the picker serves; with `config_path`, tenants
    reload when that file changes or on SIGHUP, as the gateway's do. Everything is
    stopped on exit."""
    server = services.config.server
    timeout = aiohttp.ClientTimeout(total=server.total_timeout_s,
                                    connect=server.connect_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await services.start(session, config_path)
        services.started = True
        for pool in services.pools.values():
            for worker in pool.workers:
                if endpoint_of(worker.url) is None:
                    log.warning("worker %s of pool %s has no ip:port; the picker cannot "
                                "name it to Envoy (use the pod IP)", worker.url, pool.name)
        try:
            yield services
        finally:
            await services.stop()
