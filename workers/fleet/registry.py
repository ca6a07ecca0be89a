"""Worker registration in Redis with a heartbeat TTL, discovery, and drain flags.

Key layout (policies/keys.py; `{url}` is the worker's base URL as is):

    worker_key(pool, url)        string, JSON WorkerInfo, EX ttl (default 10 s)
    draining_key(pool, url)      string "1" while the worker is being drained
    pool_workers_key(pool)       set of urls registered in the pool
    POOL_INDEX_KEY               set of pool names that ever registered

A worker is alive exactly while its key exists: the heartbeat thread rewrites it every
ttl/3, so a dead worker vanishes within one ttl. The sets are only an index for
discovery; `list_workers` prunes members whose key has expired. The draining flag tells
gateways to stop sending new requests to a worker that is about to be relaunched.

Entries are signed when the registering process has the fleet's shared secret
(`SPECROUTE_REGISTRY_SECRET`): a `sig` field, HMAC-SHA256 over the rest of the JSON, so a
gateway that has the secret too (`gateway.upstream.discovery`) takes no entry that anyone
with mere write access to Redis made up (docs/SECURITY.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, replace

import redis

from policies.keys import POOL_INDEX_KEY, draining_key, pool_workers_key, worker_key

logger = logging.getLogger(__name__)

DRAIN_FLAG_TTL_S = 3600  # a supervisor that dies mid-drain must not strand a worker forever
REGISTRY_SECRET_ENV = "SPECROUTE_REGISTRY_SECRET"
SIGNATURE_FIELD = "sig"


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """What a worker announces. `draining` is filled in by `list_workers`, never stored."""

    url: str
    pool: str
    engine: str
    method: str
    k: int
    model: str
    started_at: float
    pid: int
    measured: dict | None = None  # what the worker measured about itself (measured.json)
    draining: bool = False

    def to_json(self, secret: str | None = None) -> str:
        """The stored form; signed (`SIGNATURE_FIELD`) when given the fleet's secret."""
        data = asdict(self)
        del data["draining"]
        text = json.dumps(data, sort_keys=True)
        if not secret:
            return text
        return json.dumps({**data, SIGNATURE_FIELD: _sign(secret, text)}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes, draining: bool = False) -> WorkerInfo:
        data = json.loads(raw)
        return cls(url=data["url"], pool=data["pool"], engine=data["engine"],
                   method=data["method"], k=int(data["k"]), model=data["model"],
                   started_at=float(data["started_at"]), pid=int(data["pid"]),
                   measured=data.get("measured"), draining=draining)


def _sign(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def signed_by(raw: str | bytes, secret: str) -> bool:
    """Whether a stored entry carries a valid signature under `secret`."""
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    signature = data.pop(SIGNATURE_FIELD, None)
    return isinstance(signature, str) and hmac.compare_digest(
        signature, _sign(secret, json.dumps(data, sort_keys=True)))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def list_workers(client: redis.Redis, pool: str | None = None) -> list[WorkerInfo]:
    """Live workers of `pool` (or of every pool), sorted by (pool, url).

    Set members whose key has expired are removed from the set on the way.
    """
    pools = [pool] if pool is not None else sorted(_text(p) for p in client.smembers(POOL_INDEX_KEY))
    found: list[WorkerInfo] = []
    for name in pools:
        urls = sorted(_text(u) for u in client.smembers(pool_workers_key(name)))
        if not urls:
            continue
        infos = client.mget([worker_key(name, u) for u in urls])
        flags = client.mget([draining_key(name, u) for u in urls])
        dead = [u for u, raw in zip(urls, infos, strict=True) if raw is None]
        if dead:
            client.srem(pool_workers_key(name), *dead)
        for raw, flag in zip(infos, flags, strict=True):
            if raw is not None:
                found.append(WorkerInfo.from_json(raw, draining=flag is not None))
    return found


def set_draining(client: redis.Redis, pool: str, url: str, draining: bool) -> None:
    """Raise or clear the drain flag of one worker."""
    if draining:
        client.set(draining_key(pool, url), "1", ex=DRAIN_FLAG_TTL_S)
    else:
        client.delete(draining_key(pool, url))


def is_draining(client: redis.Redis, pool: str, url: str) -> bool:
    return bool(client.exists(draining_key(pool, url)))


class Registration:
    """Keeps one worker's key alive from a daemon thread until `stop()`.

    Redis outages are logged and retried at the next beat; the worker keeps serving.
    `update()` swaps the announced info (e.g. a new k after a relaunch) and beats at once.
    Entries are signed with `secret`, by default the environment's
    `SPECROUTE_REGISTRY_SECRET` (none: unsigned).
    """

    def __init__(self, redis_url: str, info: WorkerInfo, ttl: float = 10.0,
                 secret: str | None = None) -> None:
        if ttl <= 0:
            raise ValueError(f"ttl must be > 0, got {ttl}")
        self.ttl = ttl
        self._client = redis.Redis.from_url(redis_url, socket_timeout=max(ttl / 3, 0.5),
                                            socket_connect_timeout=max(ttl / 3, 0.5))
        self._info = info
        self._secret = secret if secret is not None else os.environ.get(REGISTRY_SECRET_ENV)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.beats = 0  # successful heartbeats, for logs and tests

    @property
    def info(self) -> WorkerInfo:
        return self._info

    def start(self) -> Registration:
        """Write the key now (best effort) and start the heartbeat thread."""
        if self._thread is not None:
            raise RuntimeError("registration already started")
        self.beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{self._info.url}",
                                        daemon=True)
        self._thread.start()
        return self

    def update(self, **changes: object) -> None:
        with self._lock:
            self._info = replace(self._info, **changes)  # type: ignore[arg-type]
        self.beat()

    def beat(self) -> bool:
        """One heartbeat; False (and a log line) when Redis is unreachable."""
        with self._lock:
            info = self._info
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.set(worker_key(info.pool, info.url), info.to_json(self._secret),
                     px=int(self.ttl * 1000))
            pipe.sadd(pool_workers_key(info.pool), info.url)
            pipe.sadd(POOL_INDEX_KEY, info.pool)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("heartbeat for %s failed, will retry: %s", info.url, exc)
            return False
        self.beats += 1
        return True

    def set_draining(self, draining: bool) -> None:
        info = self._info
        set_draining(self._client, info.pool, info.url, draining)

    def _run(self) -> None:
        interval = self.ttl / 3
        while not self._stop.wait(interval):
            self.beat()

    def stop(self) -> None:
        """Stop the heartbeat and delete the key, the drain flag and the set member."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.ttl)
            self._thread = None
        info = self._info
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.delete(worker_key(info.pool, info.url), draining_key(info.pool, info.url))
            pipe.srem(pool_workers_key(info.pool), info.url)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("deregistering %s failed (key expires in %.0fs): %s",
                           info.url, self.ttl, exc)
        finally:
            self._client.close()


def new_worker_info(url: str, pool: str, engine: str, method: str, k: int, model: str,
                    pid: int, measured: dict | None = None) -> WorkerInfo:
    """A WorkerInfo stamped with the current wall-clock start time."""
    return WorkerInfo(url=url, pool=pool, engine=engine, method=method, k=k, model=model,
                      started_at=time.time(), pid=pid, measured=measured)
