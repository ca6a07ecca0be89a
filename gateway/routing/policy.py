"""The routing policy a gateway process runs, chosen by name.

- `learned` (the default): `policies.decision.Policy` over a telemetry store — the shared
  Redis `TelemetryStore` (its flush coalesced: `policies.telemetry_store`) when
  `redis_url` is set, so replicas learn from each other's traffic and agree, else an
  in-process `LocalTelemetry`. Every finished request is fed back (`observe`: an O(1)
  enqueue in either store; the store's thread folds and writes Redis, the policy's
  thread refits about every second), so nothing here blocks the event loop.
- `static`, `first`: the hand-written rules (`policies.rules.RULES`). Neither learns.

All of them are a `policies.protocol.RoutingPolicy`. Lifecycle, from the routing core
(`gateway.core`): `start()` before serving, `stop()` after (the policy's thread first,
then the store, which flushes what Redis will take within ~2 s).
"""

from __future__ import annotations

from gateway.config import GatewayConfig
from policies.decision import Policy
from policies.prior import WorkerPrior
from policies.protocol import RoutingPolicy
from policies.rules import POLICY_NAMES, RULES
from policies.telemetry import LocalTelemetry, Telemetry, TelemetryConfig, TelemetryStore
from policies.telemetry_store import CoalescingTelemetryStore
from policies.types import Decision, PoolView, RequestProfile


class LearnedRoutingPolicy:
    """The learned policy and its telemetry store (see the module docstring)."""

    name = "learned"

    def __init__(self, config: GatewayConfig) -> None:
        tau_s = config.policy.decay_tau_s
        self.store: Telemetry = (
            CoalescingTelemetryStore(config.redis_url, TelemetryConfig(tau_s=tau_s))
            if config.redis_url
            else LocalTelemetry(tau_s))
        self.policy = Policy(self.store, config.policy)
        self.observe = self.policy.observe  # what a finished request teaches (see Policy)

    def decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        return self.policy.decide(profile, pools)

    def predict(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        return self.policy.predict(profile, pools)

    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None:
        self.policy.set_worker_prior(pool, prior)

    def start(self) -> None:
        if isinstance(self.store, TelemetryStore):
            self.store.start()
        self.policy.start()

    def stop(self) -> None:
        self.policy.stop()
        if isinstance(self.store, TelemetryStore):
            self.store.stop()


class PolicyFeed:
    """The policy as one of the reporter's recorders: it learns from what finished.
    `record` is the policy's own `observe`, called directly."""

    def __init__(self, policy: RoutingPolicy) -> None:
        self.record = policy.observe


def build_routing_policy(name: str, config: GatewayConfig) -> RoutingPolicy:
    """The policy called `name` (one of `POLICY_NAMES`), not yet started."""
    if name == "learned":
        return LearnedRoutingPolicy(config)
    if name in RULES:
        return RULES[name]
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
