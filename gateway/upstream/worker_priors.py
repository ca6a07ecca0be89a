"""What each pool's workers measured about themselves, handed to the routing policy.

The policy starts from it and telemetry then outweighs it (policies/prior.py). Sources,
per pool, first found wins:
- configured workers: `GET /server_info` — an embedded worker's `specroute_measured`
  (its `measured.json`), else SGLang's `internal_states[].avg_spec_accept_length` (one
  value per server: the same for every request class). Read at startup, then every
  `interval_s` for pools that have none yet (an SGLang server reports its average only
  after it has served traffic; a worker may start after the gateway);
- discovered workers: the `measured` field of their registry entry
  (`RegistryDiscovery` hands every live entry to `from_registry`).
Engines without `/server_info` (vLLM, other OpenAI-compatible servers) give none: the
policy's flat prior applies. Off the request path; a worker that does not answer is
asked again later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from gateway.periodic import Periodic
from gateway.pools import Pool
from gateway.upstream.adapters.base import worker_auth
from gateway.upstream.adapters.sglang import prior_from_server_info
from policies.prior import Measured, MeasuredError, WorkerPrior
from workers.fleet.registry import WorkerInfo

log = logging.getLogger("specroute.gateway")
SetPrior = Callable[[str, WorkerPrior], None]
SERVER_INFO_ENGINES = ("sglang", "embedded")


class WorkerPriors:
    def __init__(self, pools: dict[str, Pool], session: aiohttp.ClientSession,
                 set_prior: SetPrior, interval_s: float) -> None:
        self.pools = pools
        self.session = session
        self.set_prior = set_prior
        self.interval_s = interval_s
        self.timeout = aiohttp.ClientTimeout(total=max(1.0, interval_s))
        self.sources: dict[str, str] = {}  # pool -> where its prior came from
        self._loop = Periodic("specroute-worker-priors", self.probe_missing, interval_s)

    def _give(self, pool: Pool, prior: WorkerPrior | None, where: str) -> bool:
        if prior is None or not prior.acceptance:
            return False
        self.set_prior(pool.name, prior)
        self.sources[pool.name] = where
        log.info("pool %s: prior from %s (%s)", pool.name, where, prior.source)
        return True

    async def _server_info(self, url: str, api_key: str | None) -> dict | None:
        try:
            async with self.session.get(url + "/server_info", timeout=self.timeout,
                                        headers=worker_auth(api_key)) as resp:
                if resp.status != 200:
                    return None
                body = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    async def probe(self, pool: Pool) -> bool:
        """Ask the pool's workers in turn until one has a measurement."""
        if pool.config.engine not in SERVER_INFO_ENGINES or pool.config.method == "plain":
            return False
        for worker in list(pool.workers):
            body = await self._server_info(worker.url, pool.config.api_key)
            if body is not None and self._give(pool, prior_from_server_info(pool.config, body),
                                               f"{worker.url}/server_info"):
                return True
        return False

    async def probe_missing(self) -> None:
        await asyncio.gather(*(self.probe(pool) for name, pool in self.pools.items()
                               if name not in self.sources))

    def from_registry(self, pool: Pool, info: WorkerInfo) -> None:
        """A discovered worker's registry entry; the first valid measurement per pool."""
        if pool.name in self.sources or not info.measured or pool.config.method == "plain":
            return
        try:
            measured = Measured.from_dict(info.measured)
        except MeasuredError as exc:
            log.warning("worker %s: ignoring its measurement: %s", info.url, exc)
            return
        self._give(pool, WorkerPrior.from_measured(pool.config.model, pool.config.method,
                                                   measured), f"registry entry of {info.url}")

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
