"""The one seam between the router and a routing policy.

Every policy — the learned one (`policies.decision.Policy` behind its telemetry store),
the hand-written rules (`policies.rules`), the gateway's SLO-aware wrapper and the
simulator's baselines — implements `RoutingPolicy`, as every load-balancing policy of
smg implements one trait (`policies/mod.rs`): the router calls it and nothing else.

- `decide(profile, pools)`: the live choice; may explore and move counters. Raises
  ValueError when no pool has a healthy worker (the router answers 503).
- `predict(profile, pools)`: the same ranking without side effects (no counter, RNG
  draw or exploration): what explain, the console and pinned requests use.
- `observe(record)`: a finished request, to learn from (off the request path).
- `set_worker_prior(pool, prior)`: what a pool's workers measured about themselves.
- `start()` / `stop()`: background work (refits, telemetry flushes).

`Rule` is a policy that is only a function: it learns nothing, so the last four are
no-ops (smg's trait defaults).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from policies.prior import WorkerPrior
from policies.types import Decision, PoolView, RequestProfile, RequestRecord

DecideFn = Callable[[RequestProfile, list[PoolView]], Decision]


class RoutingPolicy(Protocol):
    name: str

    def decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision: ...

    def predict(self, profile: RequestProfile, pools: list[PoolView]) -> Decision: ...

    def observe(self, record: RequestRecord) -> None: ...

    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Rule:
    """A fixed function as a policy: `predict` is `decide`, nothing to learn or run."""

    def __init__(self, decide: DecideFn, name: str) -> None:
        self.decide = decide
        self.predict = decide
        self.name = name

    def observe(self, record: RequestRecord) -> None:
        """Nothing to learn."""

    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None:
        """Nothing to start from."""

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""
