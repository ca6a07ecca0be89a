"""Worker pools at run time: who may take a request now, and which one should.

A worker takes new requests only when all three agree:
- health (`gateway.upstream.health`): active probes; `unhealthy_after` failures in a row take it
  out, `healthy_after` successes in a row bring it back (the first answer decides for a
  worker never probed yet, so a fresh gateway is ready at once); a probe that only timed
  out does not count against a worker that answered a request within that span;
- its circuit breaker: request failures in a row open it for a cooldown, after which
  one trial request is let through (half-open); that request's outcome closes or
  re-opens it (the classic breaker of Nygard, "Release It!", 2007);
- the registry's drain flag (`gateway.upstream.discovery`): a worker about to be relaunched
  finishes what it has but gets nothing new.

A pool none of whose workers is available falls back on its last resort, as Envoy's
panic threshold does for a cluster: workers down only because their probes timed out
(not refused, not answered with an error), with a closed breaker and no drain flag, take
requests again. On two cores shared with an engine that is starting, every `/health` of a
pool can be slow at once; a 503 then is worse than a slow answer. A worker that is truly
wedged fails its requests, and its breaker takes it out of the last resort too.

Within a pool the least-loaded eligible worker wins; with more than two eligible,
power of two choices (Mitzenmacher 2001: two random candidates, the less loaded one),
which avoids the herd that pure least-outstanding causes across gateway replicas.

Workers that report their batch (the embedded worker's `specroute_batch`: mean sequences
per forward over the request's decode steps) tell the gateway about traffic it did not
send. A pool keeps the latest report and offers it to the policy fading towards 1 with
time constant `REPORTED_BATCH_TAU_S`: a batch seen a few seconds ago says little about
the next request's (`PoolView.reported_batch`).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum

from gateway.config import GatewayConfig, PoolConfig, ServerConfig
from policies.types import Decision, PoolView

REPORTED_BATCH_TAU_S = 3.0  # about one request's life at the batches that matter


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class CircuitBreaker:
    """Per-worker request-failure breaker; `now` is `time.monotonic()` seconds."""

    failures_to_open: int
    cooldown_s: float
    failures: int = 0
    opened_at: float | None = None
    trial_in_flight: bool = False

    def state(self, now: float) -> BreakerState:
        if self.opened_at is None:
            return BreakerState.CLOSED
        if now - self.opened_at < self.cooldown_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    def allows(self, now: float) -> bool:
        if self.opened_at is None:  # closed: the common case, asked per pool per request
            return True
        state = self.state(now)
        return state is BreakerState.CLOSED or (
            state is BreakerState.HALF_OPEN and not self.trial_in_flight)

    def begin(self, now: float) -> None:
        """A request was sent; in half-open it is the one trial."""
        if self.opened_at is not None and self.state(now) is BreakerState.HALF_OPEN:
            self.trial_in_flight = True

    def success(self) -> None:
        self.failures, self.opened_at, self.trial_in_flight = 0, None, False

    def failure(self, now: float, *, hard: bool = False) -> None:
        """Count one failed request; `hard` (connection refused) opens at once."""
        self.failures += 1
        self.trial_in_flight = False
        if hard or self.failures >= self.failures_to_open or self.opened_at is not None:
            self.opened_at = now


@dataclass(slots=True)
class Worker:
    url: str
    breaker: CircuitBreaker
    healthy: bool = False  # unknown until the first probe answers
    probed: bool = False
    probe_failures: int = 0  # consecutive
    probe_successes: int = 0  # consecutive
    draining: bool = False
    discovered: bool = False  # came from the Redis registry, not the config
    outstanding: int = 0
    served_at: float = -math.inf  # time.monotonic() of the last request it answered
    timed_out: bool = False  # its last probe got no answer in time

    def served(self, now: float) -> None:
        """A request answered: closes the breaker and shows the worker alive."""
        self.breaker.success()
        self.served_at = now

    def available(self, now: float) -> bool:
        return self.healthy and not self.draining and (
            self.breaker.opened_at is None or self.breaker.allows(now))  # closed: no call

    def last_resort(self, now: float) -> bool:
        """Down only because its probes timed out: taken when nothing else is available."""
        return (self.timed_out and not self.healthy and not self.draining
                and self.breaker.allows(now))

    def state(self, now: float) -> dict:
        """For `/ready` and `/v1/routing/explain`."""
        return {"url": self.url, "healthy": self.healthy, "draining": self.draining,
                "breaker": self.breaker.state(now).value, "outstanding": self.outstanding,
                "probe_failures": self.probe_failures,
                "probe_successes": self.probe_successes, "timed_out": self.timed_out,
                "discovered": self.discovered}


@dataclass(slots=True, eq=False)  # identity: the router tests membership on hot paths
class Pool:
    config: PoolConfig
    server: ServerConfig
    workers: list[Worker] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)
    reported: tuple[float, float] | None = None  # (batch per worker, monotonic time)

    @property
    def name(self) -> str:
        return self.config.name

    def new_worker(self, url: str, *, discovered: bool = False) -> Worker:
        breaker = CircuitBreaker(self.server.breaker_failures, self.server.breaker_cooldown_s)
        worker = Worker(url, breaker, discovered=discovered)
        self.workers.append(worker)
        return worker

    def worker(self, url: str) -> Worker | None:
        return next((w for w in self.workers if w.url == url), None)

    @property
    def healthy_workers(self) -> int:
        """len(takers()), counted without lists: asked ~4 times a request."""
        now = time.monotonic()
        count = 0
        for worker in self.workers:  # a loop, not sum(genexpr)
            if worker.available(now):
                count += 1
        if count == 0:
            for worker in self.workers:
                if worker.last_resort(now):
                    count += 1
        return count

    @property
    def up_workers(self) -> int:
        """The available workers only (health, breaker, drain), last resort not counted."""
        now = time.monotonic()
        return sum(1 for worker in self.workers if worker.available(now))

    def takers(self, now: float) -> list[Worker]:
        """The workers that take requests now: the available ones, else the last resort
        (Envoy's panic threshold, narrowed to workers whose probes only timed out)."""
        available = [w for w in self.workers if w.available(now)]
        return available or [w for w in self.workers if w.last_resort(now)]

    def in_panic(self, now: float) -> bool:
        """No worker available, some on their last resort."""
        takers = self.takers(now)
        return bool(takers) and not takers[0].available(now)

    @property
    def outstanding(self) -> int:
        count = 0
        for worker in self.workers:
            count += worker.outstanding
        return count

    def note_batch(self, batch: float, now: float) -> None:
        """A worker of the pool answered having run `batch` sequences per forward."""
        if batch >= 1.0 and math.isfinite(batch):
            self.reported = (batch, now)

    def reported_batch(self, now: float) -> float:
        """The latest report, faded towards 1 by its age; 0 when there is none."""
        if self.reported is None:
            return 0.0
        batch, at = self.reported
        return 1.0 + (batch - 1.0) * math.exp(-max(now - at, 0.0) / REPORTED_BATCH_TAU_S)

    def view(self) -> PoolView:
        config = self.config
        return PoolView(config.name, config.engine, config.method, config.k,
                        config.capabilities.per_request_k, self.healthy_workers,
                        self.outstanding,
                        reported_batch=self.reported_batch(time.monotonic()))

    def pick(self, exclude: frozenset[str] | set[str] = frozenset()) -> Worker | None:
        """Least outstanding among eligible workers; power of two choices beyond two."""
        eligible = self.takers(time.monotonic())
        if exclude:
            eligible = [w for w in eligible if w.url not in exclude]
        if len(eligible) > 2:
            eligible = self.rng.sample(eligible, 2)
        elif len(eligible) == 1:  # one worker: nothing to compare
            return eligible[0]
        return min(eligible, key=lambda w: w.outstanding, default=None)


def build_pools(config: GatewayConfig) -> dict[str, Pool]:
    pools = {}
    for pool_config in config.pools:
        pool = Pool(pool_config, config.server)
        for url in pool_config.workers:
            pool.new_worker(url)
        pools[pool.name] = pool
    return pools


def served(decision: Decision, pool: Pool, *, pinned_k: int | None = None,
           why: str | None = None) -> Decision:
    """The decision as `pool` runs it — the one place `k` is set after the policy chose:
    a per-request-k pool runs the decided k (or the one pinned by `x-specroute-k`),
    a pool that fixes k at launch (SGLang, vLLM) its launch k (`PoolConfig.run_k`).
    On another pool than the decision's (failover, a picker's subset hint) the pool,
    method and k are that pool's and `why` (default: failover) joins the reason."""
    if pinned_k is not None and pool.config.capabilities.per_request_k:
        mark = "k" if decision.k == pinned_k else f"k={pinned_k}"
        decision = replace(decision, k=pinned_k,
                           reason=f"{decision.reason}; {mark} pinned by x-specroute-k")
    k = pool.config.run_k(decision.k)
    if pool.name != decision.pool:
        return replace(decision, pool=pool.name, method=pool.config.method, k=k,
                       reason=f"{decision.reason}; {why or f'failover to {pool.name}'}")
    return decision if k == decision.k else replace(decision, k=k)
