"""Worker discovery from the Redis registry that workers heartbeat into.

The key layout is `workers.fleet.registry`'s (policies/keys.py, docs/FLEET.md):
`pool_workers_key(pool)` indexes URLs, `worker_key(pool, url)` holds the JSON `WorkerInfo`
while the worker is alive (TTL), `draining_key(pool, url)` is set while it is being
drained. Every `server.discovery_interval_s` the gateway reads that for each configured
pool, off the request path: registered workers join the pool of the same name (workers
of another model are ignored with one warning), expired ones leave it (workers listed in
the config stay), the drain flag is copied onto every worker of the pool, and every live
entry goes to `on_entry` (the gateway reads the worker's measurement from it). Redis
being slow or down never blocks a request: a read that fails or times out keeps the
last known set.

Write access to Redis is not trusted to name workers (docs/SECURITY.md): an entry is
taken only when its URL is inside the pool's `registry_allow` (CIDRs, host names or `*`
patterns; by default the hosts of the pool's configured `workers` and loopback), it
names this pool, and, with `server.registry_secret` set, it carries the registering
supervisor's valid HMAC (`workers.fleet.registry.signed_by`). Anything else is ignored,
with one warning per URL: it never gets a probe, a prior or a request.
"""

from __future__ import annotations

import asyncio
import fnmatch
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.periodic import Periodic
from gateway.pools import Pool, Worker
from policies.keys import draining_key, pool_workers_key, worker_key
from workers.fleet.registry import WorkerInfo, signed_by

log = logging.getLogger("specroute.gateway")
OnNewWorker = Callable[[Pool, Worker], Awaitable[None]]
OnEntry = Callable[[Pool, WorkerInfo], None]


LOOPBACK_NAMES = ("localhost",)


def url_allowed(url: str, allow: tuple[str, ...]) -> bool:
    """Whether `url`'s host is inside one of `allow`'s entries: a CIDR (an address host
    only), an exact host, or a `fnmatch` pattern (`*.svc.cluster.local`)."""
    host = (urlsplit(url).hostname or "").lower()
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in allow:
        if "/" in entry:
            if address is not None and address in ipaddress.ip_network(entry, strict=False):
                return True
        elif fnmatch.fnmatchcase(host, entry.lower()):
            return True
    return False


def default_allow(pool: Pool) -> tuple[str, ...]:
    """A pool without `registry_allow`: its configured workers' hosts and loopback."""
    hosts = tuple(urlsplit(url).hostname or "" for url in pool.config.workers)
    return (*hosts, *LOOPBACK_NAMES, "127.0.0.0/8", "::1/128")


class RegistryDiscovery:
    def __init__(self, pools: dict[str, Pool], redis_url: str, interval_s: float,
                 on_new: OnNewWorker | None = None, on_entry: OnEntry | None = None,
                 secret: str | None = None) -> None:
        self.pools = pools
        self.secret = secret  # entries must be signed with it (None: unsigned taken)
        self.allow = {name: pool.config.registry_allow or default_allow(pool)
                      for name, pool in pools.items()}
        self.interval_s = interval_s
        self.on_new = on_new
        self.on_entry = on_entry  # every live entry of the pool's model (its measurement)
        timeout = max(0.2, min(1.0, interval_s / 2))
        self.client = aioredis.Redis.from_url(redis_url, socket_timeout=timeout,
                                              socket_connect_timeout=timeout)
        self._loop = Periodic("specroute-discovery", self.sync, interval_s)
        self._failing = False
        self._warned: set[str] = set()
        self.syncs = 0  # successful reads, for /ready and tests

    async def _read(self, pool: str) -> tuple[list[WorkerInfo], set[str]]:
        """Live registered workers of `pool`, and the URLs flagged draining."""
        urls = sorted(u.decode()  # type: ignore[union-attr]  # the client returns bytes
                      for u in await self.client.smembers(pool_workers_key(pool)))
        current = self.pools[pool]
        flagged = sorted({*urls, *(w.url for w in current.workers)})
        infos = await self.client.mget([worker_key(pool, u) for u in urls]) if urls else []
        flags = await self.client.mget([draining_key(pool, u) for u in flagged])
        live = [info for url, raw in zip(urls, infos, strict=True) if raw is not None
                and (info := self._accepted(pool, url, raw)) is not None]
        return live, {u for u, flag in zip(flagged, flags, strict=True) if flag is not None}

    def _accepted(self, pool: str, member: str, raw: bytes | str) -> WorkerInfo | None:
        """The entry, when it is one this gateway may send requests to (module doc)."""
        info = WorkerInfo.from_json(raw)
        why = None
        if self.secret is not None and not signed_by(raw, self.secret):
            why = "is not signed with the registry secret"
        elif info.pool != pool or info.url != member:
            why = f"names pool {info.pool!r} and URL {info.url!r}"
        elif not url_allowed(info.url, self.allow[pool]):
            why = "is outside the pool's registry_allow"
        if why is None:
            return info
        if member not in self._warned:
            self._warned.add(member)
            log.warning("registry entry %s in pool %s %s; ignored", member, pool, why)
        return None

    def _merge(self, pool: Pool, live: list[WorkerInfo], draining: set[str]) -> list[Worker]:
        added = []
        for info in live:
            url = info.url.rstrip("/")
            if info.model != pool.config.model:
                if url not in self._warned:
                    self._warned.add(url)
                    log.warning("worker %s registered in pool %s serves %r, not %r; ignored",
                                url, pool.name, info.model, pool.config.model)
                continue
            if pool.worker(url) is None:
                log.info("discovered worker %s in pool %s", url, pool.name)
                added.append(pool.new_worker(url, discovered=True))
        alive = {info.url.rstrip("/") for info in live}
        for worker in [w for w in pool.workers if w.discovered and w.url not in alive]:
            log.info("worker %s left pool %s (registration expired)", worker.url, pool.name)
            pool.workers.remove(worker)  # a lease still holding it finishes normally
        for worker in pool.workers:
            worker.draining = worker.url in draining
        return added

    async def sync(self) -> None:
        """One read of the registry; keeps the last known state when Redis fails."""
        try:
            reads = {name: await asyncio.wait_for(self._read(name), self.interval_s)
                     for name in self.pools}
        except (TimeoutError, RedisError, OSError, ValueError, KeyError) as exc:
            if not self._failing:
                log.warning("worker registry unreachable, keeping the last known workers: %s",
                            exc)
            self._failing = True
            return
        if self._failing:
            log.info("worker registry reachable again")
        self._failing = False
        self.syncs += 1
        for name, (live, draining) in reads.items():
            pool = self.pools[name]
            for worker in self._merge(pool, live, draining):
                if self.on_new is not None:
                    await self.on_new(pool, worker)
            if self.on_entry is not None:
                for info in live:
                    if info.model == pool.config.model:
                        self.on_entry(pool, info)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        await self.client.aclose()
