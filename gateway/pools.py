"""Worker pools at run time: health, outstanding requests, least-loaded choice.

A worker is healthy when its last `GET /health` answered 200 and no request has
failed to connect to it since. The monitor polls every worker each
`server.health_interval_s`; a connection failure on the request path marks the
worker down at once so the next request skips it without waiting for the poll.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

from gateway.config import GatewayConfig, PoolConfig
from policies.types import PoolView

log = logging.getLogger("specroute.gateway")


@dataclass(slots=True)
class Worker:
    url: str
    healthy: bool = False  # unknown until the first probe answers
    outstanding: int = 0


class Pool:
    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.workers = [Worker(url) for url in config.workers]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def healthy_workers(self) -> int:
        return sum(w.healthy for w in self.workers)

    @property
    def outstanding(self) -> int:
        return sum(w.outstanding for w in self.workers)

    def view(self) -> PoolView:
        return PoolView(name=self.config.name, engine=self.config.engine,
                        method=self.config.method, k=self.config.k,
                        per_request_k=self.config.capabilities.per_request_k,
                        healthy_workers=self.healthy_workers, outstanding=self.outstanding)

    def pick(self, exclude: set[str] = frozenset()) -> Worker | None:  # type: ignore[assignment]
        """The healthy worker with the fewest requests in flight, skipping `exclude`."""
        best: Worker | None = None
        for worker in self.workers:
            if worker.healthy and worker.url not in exclude and (
                    best is None or worker.outstanding < best.outstanding):
                best = worker
        return best


def build_pools(config: GatewayConfig) -> dict[str, Pool]:
    return {pool.name: Pool(pool) for pool in config.pools}


class HealthMonitor:
    """Polls every worker's `/health`; owns no state besides its task."""

    def __init__(self, pools: dict[str, Pool], session: aiohttp.ClientSession,
                 interval_s: float) -> None:
        self.pools = pools
        self.session = session
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=max(1.0, interval_s))
        self._task: asyncio.Task | None = None

    async def probe(self, worker: Worker) -> None:
        try:
            async with self.session.get(worker.url + "/health", timeout=self.timeout) as r:
                healthy = r.status == 200
        except (TimeoutError, aiohttp.ClientError):
            healthy = False
        if healthy != worker.healthy:
            log.info("worker %s is now %s", worker.url, "healthy" if healthy else "down")
        worker.healthy = healthy

    async def probe_all(self) -> None:
        workers = [w for pool in self.pools.values() for w in pool.workers]
        await asyncio.gather(*(self.probe(w) for w in workers))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.probe_all()

    async def start(self) -> None:
        await self.probe_all()
        self._task = asyncio.create_task(self._run(), name="specroute-health")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
