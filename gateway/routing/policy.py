"""The routing policy a gateway process runs, chosen by name, with its lifecycle.

- `learned` (the default): `policies.decision.Policy` over a telemetry store — the shared
  Redis `TelemetryStore` (its flush coalesced: `gateway.routing.telemetry_store`) when
  `redis_url` is set, so replicas learn from each other's traffic and agree, else an in-process `LocalTelemetry`. Every finished request is fed
  back (`record`: an O(1) enqueue in either store; the store's thread folds and writes
  Redis, the policy's thread refits about every second), so nothing here blocks the
  event loop.
- `static`: `gateway.routing.router.static_rules`; `first`: `gateway.routing.router.first_healthy`.
  Neither learns.

Lifecycle, from the app lifespan: `start()` before serving, `stop()` after (the policy's
thread first, then the store, which flushes what Redis will take within ~2 s).
"""

from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.routing.router import Decide
from gateway.routing.telemetry_store import CoalescingTelemetryStore
from policies.decision import Policy
from policies.prior import WorkerPrior
from policies.rules import POLICY_NAMES, first_healthy, static_rules
from policies.telemetry import LocalTelemetry, Telemetry, TelemetryConfig, TelemetryStore
from policies.types import RequestRecord


class RoutingPolicy:
    """A fixed rule: decides, learns nothing; `predict` (for explain) is `decide`, or the
    policy's side-effect-free ranking."""

    def __init__(self, decide: Decide, name: str, predict: Decide | None = None) -> None:
        self.decide = decide
        self.predict = predict or decide
        self.name = name

    def record(self, record: RequestRecord) -> None:
        """Nothing to learn."""

    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None:
        """Nothing to start from."""

    def start(self) -> None:
        """Nothing to start."""

    def stop(self) -> None:
        """Nothing to stop."""


class LearnedRoutingPolicy(RoutingPolicy):
    """The learned policy and its telemetry store (see the module docstring)."""

    def __init__(self, config: GatewayConfig) -> None:
        tau_s = config.policy.decay_tau_s
        self.store: Telemetry = (
            CoalescingTelemetryStore(config.redis_url, TelemetryConfig(tau_s=tau_s))
            if config.redis_url
            else LocalTelemetry(tau_s))
        self.policy = Policy(self.store, config.policy)
        super().__init__(self.policy.decide, "learned", self.policy.predict)

    def record(self, record: RequestRecord) -> None:
        """Feed successful requests only: a failure carries no acceptance, and its
        tokens-free time would read as a very slow step."""
        if record.ok and record.output_tokens > 0:
            self.policy.observe(record)

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


def build_routing_policy(name: str, config: GatewayConfig) -> RoutingPolicy:
    """The policy called `name` (one of `POLICY_NAMES`), not yet started."""
    if name == "learned":
        return LearnedRoutingPolicy(config)
    if name == "static":
        return RoutingPolicy(static_rules, "static")
    if name == "first":
        return RoutingPolicy(first_healthy, "first")
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_NAMES)}")
