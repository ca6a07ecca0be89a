"""The background work that keeps a process's view of its workers current: health probes,
the workers' published priors, the engines' own `/metrics` counters, and (with Redis) the
registry's discovery. The standalone gateway and the endpoint picker run the same set, in
the same order; one place builds, starts and stops it."""

from __future__ import annotations

import aiohttp
from prometheus_client import CollectorRegistry

from gateway.config import ServerConfig
from gateway.pools import Pool
from gateway.upstream.engine_metrics import EngineMetrics
from gateway.upstream.health import HealthMonitor
from gateway.upstream.worker_priors import SetPrior, WorkerPriors


class UpstreamWatchers:
    def __init__(self, pools: dict[str, Pool], session: aiohttp.ClientSession,
                 server: ServerConfig, redis_url: str | None, registry: CollectorRegistry,
                 set_worker_prior: SetPrior) -> None:
        self.monitor = HealthMonitor(pools, session, server)
        self.priors = WorkerPriors(pools, session, set_worker_prior, server.health_interval_s)
        self.engines = EngineMetrics(pools, session, registry, server.health_interval_s)
        self.discovery = None
        if redis_url:
            from gateway.upstream.discovery import RegistryDiscovery

            self.discovery = RegistryDiscovery(pools, redis_url, server.discovery_interval_s,
                                               on_new=self.monitor.probe,
                                               on_entry=self.priors.from_registry,
                                               secret=server.registry_secret)

    async def start(self) -> None:
        await self.monitor.start()
        await self.priors.start()
        await self.engines.start()
        if self.discovery is not None:
            await self.discovery.start()

    async def stop(self) -> None:
        if self.discovery is not None:
            await self.discovery.stop()
        await self.engines.stop()
        await self.priors.stop()
        await self.monitor.stop()
