"""Admission: per-pool slots and queues ordered by SLO deadline, and shedding under overload.

Each pool runs at most `admission.max_inflight_per_worker` x healthy workers requests at
once (0 turns queueing off: every request starts at once). A request that finds no free
slot waits in its pool's queue, ordered (with `slo_aware`) by its deadline (arrival +
its tenant's `slo_ttft_ms`; earliest first), higher `priority` breaking ties, arrival
order last. Without `slo_aware` the queue is first come, first served.

With `slo_aware`, lower-priority work gives way before a higher-priority tenant misses:

- **reserved slots**: while a higher priority has been seen in the last `recent_s`,
  lower priorities may not take a pool's last `reserved_slots` slots, so a
  higher-priority arrival finds one free instead of waiting for a long batch request;
- **shedding to keep a deadline**: when a new request is predicted to start after its
  deadline (its place in the queue x the pool's mean slot time / slots), queued requests
  of lower priority ahead of it are shed, lowest priority and latest deadline first,
  until it is predicted to start in time;
- **a full queue** (`max_queue`) sheds its worst entry (lowest priority, then latest
  deadline), which may be the newcomer.

Without `slo_aware` a full queue refuses the newcomer. Either way a request that waited
`max_wait_s` is shed. A shed request gets 429 `overloaded` with `Retry-After` (the
predicted time for the queue to drain); a client that leaves while queued gives its
place up. The SLO-aware policy (`gateway.routing.slo_aware.SloAware`) reads `pool_state` to know which
pools are busy and what a tenant would wait there.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.config import AdmissionConfig, TenantConfig
from gateway.errors import RateLimited
from gateway.pools import Pool

EMA_ALPHA = 0.2  # weight of the newest slot time in a pool's mean


class AdmissionMetrics(Protocol):
    def queue_depth(self, pool: str, depth: int) -> None: ...
    def queue_wait(self, pool: str, seconds: float) -> None: ...
    def shed(self, tenant: str, reason: str) -> None: ...


@dataclass(eq=False, slots=True)
class Ticket:
    """A request's place: waiting, then holding a slot until `Admission.leave`."""

    pool: str
    tenant: TenantConfig
    arrived: float
    deadline: float
    seq: int
    future: asyncio.Future | None = None
    granted: float = 0.0

    @property
    def queued_s(self) -> float:
        return max(self.granted - self.arrived, 0.0) if self.granted else 0.0


@dataclass(slots=True)
class PoolQueue:
    running: int = 0
    running_by_priority: Counter = field(default_factory=Counter)
    waiting: list[Ticket] = field(default_factory=list)
    slot_s: float = 0.0  # mean time a request holds a slot; 0 until one has finished
    reported_depth: int = -1  # the queue depth the metrics last got (-1: none yet)


@dataclass(frozen=True, slots=True)
class PoolState:
    """What the SLO-aware policy needs to know of a pool, for one tenant."""

    busy: bool
    wait_s: float  # predicted queue wait for a new request of this tenant
    higher_priority: int  # requests of higher priority running or waiting here


class Admission:
    def __init__(self, config: AdmissionConfig, pools: dict[str, Pool],
                 metrics: AdmissionMetrics | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.config = config
        self.pools = pools
        self.metrics = metrics
        self.clock = clock
        self.queues = {name: PoolQueue() for name in pools}
        self.seen: dict[int, float] = {}  # priority -> last arrival
        self.tenant_in_flight: Counter = Counter()  # tenant name -> requests admitted or waiting
        self.seq = 0

    # -- the request path -------------------------------------------------------------
    async def enter(self, pool: str, tenant: TenantConfig, arrived: float) -> Ticket:
        """A slot in `pool` for this request, waiting for one if needed; raises
        `RateLimited` (429 overloaded) when the request is shed, and (429
        concurrency_limit) when its tenant already has `max_concurrency` requests here,
        waiting or running, so one tenant cannot take every slot of a replica."""
        cap = tenant.max_concurrency
        if cap and self.tenant_in_flight[tenant.name] >= cap:
            if self.metrics is not None:
                self.metrics.shed(tenant.name, "concurrency limit")
            raise RateLimited(f"Tenant '{tenant.name}' has {cap} requests in flight, its "
                              f"max_concurrency; retry when one ends", retry_after_s=1.0,
                              code="concurrency_limit")
        self.tenant_in_flight[tenant.name] += 1
        try:
            return await self._enter(pool, tenant, arrived)
        except BaseException:
            self.tenant_in_flight[tenant.name] -= 1
            raise

    async def _enter(self, pool: str, tenant: TenantConfig, arrived: float) -> Ticket:
        now = self.clock()
        self.seq += 1
        self.seen[tenant.priority] = now
        ticket = Ticket(pool, tenant, arrived, arrived + tenant.slo_ttft_ms / 1000, self.seq)
        queue = self.queues.setdefault(pool, PoolQueue())
        if self.config.max_inflight_per_worker <= 0 or (
                not queue.waiting and self._may_start(queue, pool, tenant.priority, now)):
            self._grant(queue, ticket, now)
            return ticket
        ticket.future = asyncio.get_running_loop().create_future()
        if len(queue.waiting) >= self.config.max_queue:
            worst = max([*queue.waiting, ticket], key=self._worst_first) \
                if self.config.slo_aware else ticket
            self._shed(queue, worst, "queue full")
            if worst is ticket:
                ticket.future.exception()  # retrieved: raised below, not "never retrieved"
                raise self._overloaded(queue, pool, "the queue is full")
        queue.waiting.append(ticket)
        if self.config.slo_aware:
            self._protect(queue, pool, ticket, now)
        self._dispatch(queue, pool)
        self._depth(pool, queue)
        try:
            async with asyncio.timeout(max(ticket.arrived + self.config.max_wait_s - now, 0)):
                await ticket.future
        except TimeoutError:
            self._remove(queue, pool, ticket)
            self._count_shed(ticket, "waited too long")
            raise self._overloaded(queue, pool, f"no slot within "
                                   f"{self.config.max_wait_s:g} s") from None
        except BaseException:
            if ticket.granted:
                self._release(ticket)  # granted as the waiter was cancelled: give it back
            else:
                self._remove(queue, pool, ticket)
            raise
        return ticket

    def leave(self, ticket: Ticket) -> None:
        """The request is done with its slot."""
        self.tenant_in_flight[ticket.tenant.name] -= 1
        self._release(ticket)

    def _release(self, ticket: Ticket) -> None:
        queue = self.queues[ticket.pool]
        queue.running -= 1
        queue.running_by_priority[ticket.tenant.priority] -= 1
        held = self.clock() - ticket.granted
        queue.slot_s = held if not queue.slot_s else (
            (1 - EMA_ALPHA) * queue.slot_s + EMA_ALPHA * held)
        self._dispatch(queue, ticket.pool)
        self._depth(ticket.pool, queue)

    # -- what the SLO-aware policy reads ----------------------------------------------------------
    def pool_state(self, pool: str, tenant: TenantConfig) -> PoolState:
        queue = self.queues.get(pool) or PoolQueue()
        higher = _higher(queue, tenant.priority)
        if self.config.max_inflight_per_worker <= 0:
            served = self.pools.get(pool)
            busy = served is not None and served.outstanding >= \
                self.config.busy_per_worker * max(served.healthy_workers, 1)
            return PoolState(busy, 0.0, higher)
        capacity = self._capacity(pool)
        busy = bool(queue.waiting) or queue.running >= capacity
        if not busy:
            return PoolState(False, 0.0, higher)
        now = self.clock()
        probe = Ticket(pool, tenant, now, now + tenant.slo_ttft_ms / 1000, self.seq + 1)
        ahead = sum(1 for t in queue.waiting if self._order(t) < self._order(probe))
        return PoolState(True, self._wait_s(queue, capacity, ahead), higher)

    def holds_higher(self, pool: str, priority: int) -> bool:
        """Whether a request of a priority above `priority` runs or waits in `pool`:
        `pool_state(...).higher_priority > 0`, without the rest of the state."""
        queue = self.queues.get(pool)
        return queue is not None and _higher(queue, priority) > 0

    def busy(self, pool: str) -> bool:
        """`pool_state(...).busy`, cheaply: the SLO-aware policy's idle fast path asks every pool."""
        if self.config.max_inflight_per_worker <= 0:
            served = self.pools.get(pool)
            return served is not None and served.outstanding >= \
                self.config.busy_per_worker * max(served.healthy_workers, 1)
        queue = self.queues.get(pool)
        return queue is not None and (bool(queue.waiting)
                                      or queue.running >= self._capacity(pool))

    def depth(self, pool: str) -> int:
        queue = self.queues.get(pool)
        return len(queue.waiting) if queue else 0

    # -- helpers --------------------------------------------------------------------------
    def _capacity(self, pool: str) -> int:
        served = self.pools.get(pool)
        workers = served.healthy_workers if served is not None else 1
        return self.config.max_inflight_per_worker * max(workers, 1)

    def _top_priority(self, now: float) -> int | None:
        recent = [p for p, at in self.seen.items() if now - at <= self.config.recent_s]
        return max(recent) if recent else None

    def _may_start(self, queue: PoolQueue, pool: str, priority: int, now: float) -> bool:
        capacity = self._capacity(pool)
        free = capacity - queue.running
        if free <= 0:
            return False
        if self.config.slo_aware:
            top = self._top_priority(now)
            if top is not None and priority < top:
                return free > min(self.config.reserved_slots, capacity - 1)
        return True

    def _order(self, ticket: Ticket) -> tuple:
        if not self.config.slo_aware:
            return (ticket.seq,)
        return (ticket.deadline, -ticket.tenant.priority, ticket.seq)

    @staticmethod
    def _worst_first(ticket: Ticket) -> tuple:
        return (-ticket.tenant.priority, ticket.deadline, ticket.seq)

    def _grant(self, queue: PoolQueue, ticket: Ticket, now: float) -> None:
        ticket.granted = now
        queue.running += 1
        queue.running_by_priority[ticket.tenant.priority] += 1
        if self.metrics is not None:
            self.metrics.queue_wait(ticket.pool, ticket.queued_s)

    def _dispatch(self, queue: PoolQueue, pool: str) -> None:
        """Start waiting requests in queue order while slots allow (a lower priority
        blocked by a reserved slot lets a higher one behind it pass)."""
        if not queue.waiting:
            return
        now = self.clock()
        for ticket in sorted(queue.waiting, key=self._order):
            if queue.running >= self._capacity(pool):
                break
            if not self._may_start(queue, pool, ticket.tenant.priority, now):
                continue
            queue.waiting.remove(ticket)
            self._grant(queue, ticket, now)
            assert ticket.future is not None
            if not ticket.future.done():
                ticket.future.set_result(None)

    def _wait_s(self, queue: PoolQueue, capacity: int, ahead: int) -> float:
        """Predicted wait behind `ahead` queued requests: slots free at the pool's mean
        slot time over its capacity (unknown before a request finished: 0)."""
        return (ahead + 1) * queue.slot_s / capacity

    def _protect(self, queue: PoolQueue, pool: str, ticket: Ticket, now: float) -> None:
        """Shed lower-priority requests queued ahead of `ticket` while it is predicted to
        start after its deadline."""
        if not queue.slot_s:
            return
        capacity = self._capacity(pool)
        ahead = [t for t in queue.waiting if self._order(t) < self._order(ticket)]
        victims = sorted((t for t in ahead if t.tenant.priority < ticket.tenant.priority),
                         key=self._worst_first, reverse=True)
        while victims and now + self._wait_s(queue, capacity, len(ahead)) > ticket.deadline:
            victim = victims.pop(0)
            ahead.remove(victim)
            self._shed(queue, victim, "higher priority would miss its SLO")

    def _shed(self, queue: PoolQueue, ticket: Ticket, reason: str) -> None:
        if ticket in queue.waiting:
            queue.waiting.remove(ticket)
        self._count_shed(ticket, reason)
        assert ticket.future is not None
        if not ticket.future.done():
            ticket.future.set_exception(self._overloaded(queue, ticket.pool, reason))

    def _count_shed(self, ticket: Ticket, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.shed(ticket.tenant.name, reason)

    def _remove(self, queue: PoolQueue, pool: str, ticket: Ticket) -> None:
        if ticket in queue.waiting:
            queue.waiting.remove(ticket)
        self._dispatch(queue, pool)
        self._depth(pool, queue)

    def _depth(self, pool: str, queue: PoolQueue) -> None:
        depth = len(queue.waiting)
        if self.metrics is not None and depth != queue.reported_depth:  # a gauge set costs;
            queue.reported_depth = depth  # most requests leave the depth at 0
            self.metrics.queue_depth(pool, depth)

    def _overloaded(self, queue: PoolQueue, pool: str, reason: str) -> RateLimited:
        drain = self._wait_s(queue, self._capacity(pool), len(queue.waiting))
        return RateLimited(f"Pool {pool!r} is overloaded ({reason}); retry later",
                           retry_after_s=max(drain, 1.0), code="overloaded")


def _higher(queue: PoolQueue, priority: int) -> int:
    """Requests of a priority above `priority` running or waiting in `queue`."""
    higher = 0
    for running, count in queue.running_by_priority.items():  # loops, not sum(genexpr)
        if running > priority:
            higher += count
    for ticket in queue.waiting:
        if ticket.tenant.priority > priority:
            higher += 1
    return higher
