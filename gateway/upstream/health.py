"""Active health checks: every worker probed each `server.health_interval_s`.

SGLang and the embedded engine answer `GET /health`. vLLM does too, but other
OpenAI-compatible servers may not, so for `vllm`/`openai` pools a non-200 `/health`
falls back to `GET /v1/models`. Hysteresis keeps one lost probe from flapping a worker:
`unhealthy_after` failures in a row take it out, `healthy_after` successes in a row
bring it back. A worker never probed before takes the first answer as is, so a fresh
gateway serves as soon as its workers answer.

A probe that timed out (no answer within `max(2 s, health_interval_s)`) does not count
against a healthy worker that answered a request within the span those failures would
take, `unhealthy_after` probe timeouts: it is busy, not dead, as on two cores shared with
an engine that is starting. Its requests speak for it; if they fail, its circuit
breaker takes it out. A refused connection or a non-200 answer always counts. A worker
down only from timed-out probes stays its pool's last resort (`gateway.pools`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from enum import Enum

import aiohttp

from gateway.config import ServerConfig
from gateway.periodic import Periodic
from gateway.pools import Pool, Worker

log = logging.getLogger("specroute.gateway")
FALLBACK_PROBE_ENGINES = frozenset({"vllm", "openai"})


class Probe(Enum):
    OK = "ok"
    FAILED = "failed"  # refused, reset, or not 200
    TIMED_OUT = "timed_out"


PROBE_TIMEOUT_FLOOR_S = 2.0  # a busy server's /health can take a second (cloud LBs: 5 s)


def probe_timeout_s(server: ServerConfig) -> float:
    return max(PROBE_TIMEOUT_FLOOR_S, server.health_interval_s)


def busy_not_dead(worker: Worker, server: ServerConfig, now: float) -> bool:
    """A healthy worker whose probe timed out but which answered a request lately."""
    span = server.unhealthy_after * max(server.health_interval_s, probe_timeout_s(server))
    return worker.healthy and now - worker.served_at <= span


def apply_probe(worker: Worker, probe: Probe, server: ServerConfig,
                now: float | None = None) -> None:
    """Update one worker's health from one probe outcome."""
    if probe is Probe.TIMED_OUT and busy_not_dead(
            worker, server, time.monotonic() if now is None else now):
        return
    ok = probe is Probe.OK
    worker.timed_out = probe is Probe.TIMED_OUT
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
        why = "" if worker.healthy else (
            f" ({worker.probe_failures} probes in a row "
            f"{'timed out: last resort' if worker.timed_out else 'refused or failed'})")
        log.info("worker %s is now %s%s", worker.url, "healthy" if worker.healthy else "down",
                 why)


class HealthMonitor:
    """Probes every worker of every pool; owns nothing but its task."""

    def __init__(self, pools: dict[str, Pool], session: aiohttp.ClientSession,
                 server: ServerConfig) -> None:
        self.pools = pools
        self.session = session
        self.server = server
        self.timeout = aiohttp.ClientTimeout(total=probe_timeout_s(server))
        self._loop = Periodic("specroute-health", self.probe_all, server.health_interval_s)

    async def _get(self, url: str) -> Probe:
        try:
            async with self.session.get(url, timeout=self.timeout) as response:
                return Probe.OK if response.status == 200 else Probe.FAILED
        except TimeoutError:
            return Probe.TIMED_OUT
        except aiohttp.ClientError:
            return Probe.FAILED

    async def check(self, pool: Pool, worker: Worker) -> Probe:
        first = await self._get(worker.url + "/health")
        if first is Probe.FAILED and pool.config.engine in FALLBACK_PROBE_ENGINES:
            return await self._get(worker.url + "/v1/models")
        return first

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
