"""Active health checks: every worker probed each `server.health_interval_s`.

SGLang and the embedded engine answer `GET /health`. vLLM does too, but other
OpenAI-compatible servers may not, so for `vllm`/`openai` pools a non-200 `/health`
falls back to `GET /v1/models`. Hysteresis keeps one lost probe from flapping a worker:
`unhealthy_after` failures in a row take it out, `healthy_after` successes in a row
bring it back. A worker never probed before takes the first answer as is, so a fresh
gateway serves as soon as its workers answer.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from gateway.config import ServerConfig
from gateway.periodic import Periodic
from gateway.pools import Pool, Worker

log = logging.getLogger("specroute.gateway")
FALLBACK_PROBE_ENGINES = frozenset({"vllm", "openai"})


def apply_probe(worker: Worker, ok: bool, server: ServerConfig) -> None:
    """Update one worker's health from one probe outcome."""
    if ok:
        worker.probe_successes += 1
        worker.probe_failures = 0
    else:
        worker.probe_failures += 1
        worker.probe_successes = 0
    was = worker.healthy
    if not worker.probed:
        worker.healthy, worker.probed = ok, True
    elif worker.healthy and worker.probe_failures >= server.unhealthy_after:
        worker.healthy = False
    elif not worker.healthy and worker.probe_successes >= server.healthy_after:
        worker.healthy = True
    if worker.healthy != was:
        log.info("worker %s is now %s", worker.url, "healthy" if worker.healthy else "down")


class HealthMonitor:
    """Probes every worker of every pool; owns nothing but its task."""

    def __init__(self, pools: dict[str, Pool], session: aiohttp.ClientSession,
                 server: ServerConfig) -> None:
        self.pools = pools
        self.session = session
        self.server = server
        self.timeout = aiohttp.ClientTimeout(total=max(1.0, server.health_interval_s))
        self._loop = Periodic("specroute-health", self.probe_all, server.health_interval_s)

    async def _get_ok(self, url: str) -> bool:
        try:
            async with self.session.get(url, timeout=self.timeout) as response:
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def check(self, pool: Pool, worker: Worker) -> bool:
        if await self._get_ok(worker.url + "/health"):
            return True
        if pool.config.engine in FALLBACK_PROBE_ENGINES:
            return await self._get_ok(worker.url + "/v1/models")
        return False

    async def probe(self, pool: Pool, worker: Worker) -> None:
        apply_probe(worker, await self.check(pool, worker), self.server)

    async def probe_all(self) -> None:
        await asyncio.gather(*(self.probe(pool, worker) for pool in self.pools.values()
                               for worker in list(pool.workers)))

    async def start(self) -> None:
        await self.probe_all()
        self._loop.start(wait_first=True)

    async def stop(self) -> None:
        await self._loop.stop()
