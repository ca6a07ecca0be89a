"""Telemetry store: finished requests into Redis, decayed aggregates back out.

Redis layout (the keys are policies/keys.py's; see docs/POLICY.md):
- `STREAM_KEY` — stream, one entry per request (`r` = the record as JSON),
  `XADD ... MAXLEN ~ 100000`.
- `agg_key(context)` — hash of forward-decayed sums (policies/aggregates.py);
  `{context}` = `model|pool|method|k|task|temperature_bucket|load_bucket`.
- `AGG_INDEX` — set of the context strings, so readers need no SCAN.
- `desired_k_key(pool)` — string, the k the policy wants on a fixed-k pool (read by the
  worker supervisor).
- `telemetry_batch_key(id)` — string with a TTL: the batch `id` was applied.

Design: one daemon thread per store owns the Redis client. `record()` only appends, to
the in-process aggregates' pending deque and to a bounded send deque: O(1), no lock, no
I/O, never raises, so it is safe on the event loop. The thread folds the pending records
into the local aggregates (`PendingAggregates`, the same mechanism `LocalTelemetry` uses),
drains the send deque in pipelined batches and refreshes the read cache about every
second. A thread, not an asyncio task, so the same store serves async gateway code and
sync code (simulator, tests, supervisor) alike. While Redis is down the thread keeps the
batch (bounded, oldest dropped first) and retries with backoff; readers fall back to the
local aggregates, which hold everything this process recorded.

Each batch is applied once. A batch gets an id when it is formed and keeps it until Redis
has answered for it; it is applied by one script (`APPLY_ONCE_LUA`) that first sets the
batch's mark (`SET NX` with a TTL) and does nothing when the mark exists. A batch whose
reply was lost (a timeout after Redis applied it) is sent again with the same id, and is
then not counted twice. A batch Redis refuses part of (an error reply) is not retried
past its mark either: at most once, never twice.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import orjson
import redis

from policies.aggregates import (
    DECAY_TAU_S,
    ContextKey,
    ContextStats,
    PendingAggregates,
    forward_increments,
    read_stats,
    record_values,
    stale_fields,
    teaches,
)
from policies.keys import (
    AGG_INDEX,
    STREAM_KEY,
    agg_key,
    desired_k_key,
    telemetry_batch_key,
)
from policies.types import RequestRecord

log = logging.getLogger(__name__)

# KEYS[1]: the batch's mark; ARGV[1]: the mark's TTL in seconds; then every command of
# the batch as its argument count followed by its arguments. 1: applied; 0: applied before.
APPLY_ONCE_LUA = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
    return 0
end
local i = 2
while i <= #ARGV do
    local n = tonumber(ARGV[i])
    redis.call(unpack(ARGV, i + 1, i + n))
    i = i + n + 1
end
return 1
"""

Arg = str | bytes | int | float
Command = tuple[Arg, ...]


class Telemetry(Protocol):
    """What the policy needs from a store (Redis-backed or in-process)."""

    @property
    def tau_s(self) -> float: ...  # decay time constant of the aggregates

    clock: Callable[[], float]  # the time the aggregates decay by

    def record(self, rec: RequestRecord) -> None: ...

    def snapshot(self) -> dict[str, ContextStats]: ...

    def publish_desired_k(self, pool: str, k: int) -> None: ...


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    tau_s: float = DECAY_TAU_S  # decay time constant of the aggregates
    stream_maxlen: int = 100_000
    flush_interval_s: float = 0.2
    refresh_interval_s: float = 1.0
    batch_size: int = 500
    buffer_max: int = 50_000  # records held while Redis is unreachable
    stale_after_s: float = 5.0  # remote view older than this -> use local aggregates
    socket_timeout_s: float = 0.5
    batch_mark_ttl_s: int = 3600  # how long a sent batch is remembered (deduplicated)


@dataclass(frozen=True, slots=True)
class Batch:
    """Records and desired k sent to Redis together, under one id (module docstring)."""

    id: str
    records: list[RequestRecord]
    desired: dict[str, int]

    @classmethod
    def of(cls, records: list[RequestRecord], desired: dict[str, int]) -> Batch:
        return cls(uuid.uuid4().hex, records, desired)


def apply_once_args(batch: Batch, ttl_s: int, commands: list[Command]) -> list[Arg]:
    """The key and arguments of `APPLY_ONCE_LUA`: the batch's mark, its TTL, then each
    command prefixed by its length."""
    args: list[Arg] = [telemetry_batch_key(batch.id), ttl_s]
    for cmd in commands:
        args.append(len(cmd))
        args.extend(cmd)
    return args


class LocalTelemetry:
    """In-process store with an injectable clock: a gateway without Redis, the simulator
    and unit tests. `record` is an O(1) enqueue that is safe on the event loop while a
    thread snapshots; the snapshot folds the records in (`PendingAggregates`)."""

    def __init__(self, tau_s: float = DECAY_TAU_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._aggregates = PendingAggregates(tau_s)
        self.desired_k: dict[str, int] = {}

    @property
    def tau_s(self) -> float:
        return self._aggregates.tau

    def record(self, rec: RequestRecord) -> None:
        if not rec.timestamp:
            rec.timestamp = self.clock()
        self._aggregates.add(rec)

    def snapshot(self) -> dict[str, ContextStats]:
        return self._aggregates.snapshot(self.clock())

    def publish_desired_k(self, pool: str, k: int) -> None:
        self.desired_k[pool] = k


class TelemetryStore:
    """Redis-backed store shared by every gateway replica (see module docstring)."""

    def __init__(self, redis_url: str, config: TelemetryConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config or TelemetryConfig()
        self.clock = clock
        self._client = redis.Redis.from_url(
            redis_url, socket_timeout=self.config.socket_timeout_s,
            socket_connect_timeout=self.config.socket_timeout_s)
        self._local = PendingAggregates(self.config.tau_s)
        self._queue: deque[RequestRecord] = deque(maxlen=self.config.buffer_max)
        self._unsent: Batch | None = None  # sent without an answer: sent again, same id
        self._desired: dict[str, int] = {}
        self._desired_dirty: set[str] = set()
        self._remote: dict[str, dict[str, float]] = {}
        self._remote_at = float("-inf")
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.flushed = 0
        self.dropped = 0
        self.redis_errors = 0
        self.replayed = 0  # batches Redis had applied already (their reply was lost)

    # -- request path -------------------------------------------------------------------
    def record(self, rec: RequestRecord) -> None:
        """Enqueue one finished request; O(1), no lock, no I/O, never raises."""
        if not rec.timestamp:
            rec.timestamp = self.clock()
        self._local.add(rec)
        if len(self._queue) == self._queue.maxlen:
            self.dropped += 1
        self._queue.append(rec)

    def snapshot(self) -> dict[str, ContextStats]:
        """Fleet-wide aggregates from the ~1 s read cache; local ones if Redis is stale."""
        now = self.clock()
        if now - self._remote_at <= self.config.stale_after_s:
            remote = self._remote
            return {key: read_stats(fields, now, self.config.tau_s)
                    for key, fields in remote.items()}
        return self._local.snapshot(now)

    def publish_desired_k(self, pool: str, k: int) -> None:
        if self._desired.get(pool) != k:
            self._desired[pool] = k
            self._desired_dirty.add(pool)
            self._wake.set()

    @property
    def tau_s(self) -> float:
        return self.config.tau_s

    @property
    def pending(self) -> int:
        return len(self._queue) + (len(self._unsent.records) if self._unsent else 0)

    @property
    def remote_fresh(self) -> bool:
        return self.clock() - self._remote_at <= self.config.stale_after_s

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> TelemetryStore:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._run, name="specroute-telemetry",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, flush_timeout_s: float = 2.0) -> None:
        """Flush what Redis will take within the timeout, then stop the thread."""
        if self._thread is None:
            return
        deadline = time.monotonic() + flush_timeout_s
        while self.pending and time.monotonic() < deadline and self._thread.is_alive():
            self._wake.set()
            time.sleep(0.02)
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=flush_timeout_s + 1.0)
        self._thread = None
        self._client.close()

    # -- background thread -------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.0
        next_refresh = 0.0
        while not self._stopping.is_set():
            self._wake.wait(timeout=max(self.config.flush_interval_s, backoff))
            self._wake.clear()
            self._local.fold()
            try:
                self._flush()
                if time.monotonic() >= next_refresh:
                    self._refresh()
                    next_refresh = time.monotonic() + self.config.refresh_interval_s
                backoff = 0.0
            except redis.RedisError as exc:
                self.redis_errors += 1
                backoff = min(max(backoff * 2, 0.1), 2.0)
                log.debug("telemetry: redis unavailable (%s); retrying in %.1fs", exc, backoff)

    def _flush(self) -> None:
        while self._unsent is not None or self._queue or self._desired_dirty:
            if self._unsent is None:
                records = [self._queue.popleft()
                           for _ in range(min(len(self._queue), self.config.batch_size))]
                desired = {pool: self._desired[pool] for pool in list(self._desired_dirty)}
                self._desired_dirty.difference_update(desired)
                self._unsent = Batch.of(records, desired)
            batch = self._unsent
            self._write(batch)  # on an error the batch stays unsent: sent again, same id
            self._unsent = None
            self.flushed += len(batch.records)

    def _write(self, batch: Batch) -> None:
        """Apply the batch in Redis once (`APPLY_ONCE_LUA`)."""
        args = apply_once_args(batch, self.config.batch_mark_ttl_s, self._commands(batch))
        if not self._client.eval(APPLY_ONCE_LUA, 1, *args):
            self.replayed += 1

    def _commands(self, batch: Batch) -> list[Command]:
        """The batch's writes, one request at a time."""
        tau = self.config.tau_s
        out: list[Command] = []
        for rec in batch.records:
            out.append(("XADD", STREAM_KEY, "MAXLEN", "~", self.config.stream_maxlen, "*",
                        "r", orjson.dumps(rec.to_dict())))
            if not teaches(rec):
                continue
            context = ContextKey.of(rec).encode()
            key = agg_key(context)
            for name, inc in forward_increments(record_values(rec), rec.timestamp, tau).items():
                out.append(("HINCRBYFLOAT", key, name, inc))
            out.append(("HDEL", key, *stale_fields(rec.timestamp, tau)))
            out.append(("SADD", AGG_INDEX, context))
        out.extend(("SET", desired_k_key(pool), k) for pool, k in batch.desired.items())
        return out

    def _refresh(self) -> None:
        contexts = sorted(c.decode() for c in self._client.smembers(AGG_INDEX))  # type: ignore[union-attr]
        pipe = self._client.pipeline(transaction=False)
        for context in contexts:
            pipe.hgetall(agg_key(context))
        hashes = pipe.execute() if contexts else []
        self._remote = {
            context: {f.decode(): float(v) for f, v in fields.items()}
            for context, fields in zip(contexts, hashes, strict=True) if fields}
        self._remote_at = self.clock()

    def read_desired_k(self, pool: str) -> int | None:
        """Direct read of a pool's desired k (supervisor/tests; not for the request path)."""
        value = self._client.get(desired_k_key(pool))
        return int(value) if value is not None else None
