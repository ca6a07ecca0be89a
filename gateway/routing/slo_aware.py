"""The SLO-aware policy: tenants' targets steer the pick of the policy it wraps.

`SloAware` is a `policies.protocol.RoutingPolicy` around another one (the learned policy
or a rule: `gateway.routing.policy`); its `decide` / `predict` wrap the inner policy's
own, the rest is the inner policy's. The policy decides as always, then `policies.slo.choose` checks its pick against the
tenant's `slo_ttft_ms` / `slo_tpot_ms` with the pools' state from admission (busy, queue
wait, higher-priority work) and may move the request: to the fastest option that meets
the SLO when the pick misses, or, under load with higher-priority work in flight, to the
option that meets at the least fleet cost (plain, or a pool without latency work). The
verdict is appended to the decision's reason, so `/v1/routing/explain`, the response's
`specroute.reason` and the trace's `specroute.decision_reason` show it (except a live
pick that meets with no pool busy, the common case, which keeps the policy's reason:
explain still says why it stands).

Per-pool options come from the policy's side-effect-free `predict` on one pool at a time
(and, for a speculative pool taking k per request, on that pool run plain); they are
only built when the pick misses, or when some pool holds work of a higher priority than
the request's (else the pick stands whatever they say: under load, a fleet of one
priority pays no state and no prediction per pool). A policy without predictions
(`static`, `first`: predicted tokens/s 0) and `admission.slo_aware: false` pass through.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gateway.config import TenantConfig
from gateway.routing.admission import Admission, PoolState
from gateway.telemetry.tenant_metrics import TenantMetrics
from policies.prior import WorkerPrior
from policies.protocol import RoutingPolicy
from policies.slo import SloOption, SloTarget, choose
from policies.types import Decision, PoolView, RequestProfile, RequestRecord


class SloAware:
    """`inner`, with each pick checked against the tenant's SLO (module docstring);
    `tenants`: every tenant's current config by name (kept current as tenants reload),
    `default` for a name not in it."""

    def __init__(self, inner: RoutingPolicy, tenants: Mapping[str, TenantConfig],
                 default: TenantConfig, admission: Admission, enabled: bool = True,
                 metrics: TenantMetrics | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.tenants = tenants
        self.default = default
        self.admission = admission
        self.enabled = enabled
        self.metrics = metrics
        self.targets: dict[str, tuple[TenantConfig, SloTarget]] = {}  # by tenant name
        # verdicts on picks that stand with nothing to yield to, by (the policy's decision,
        # its pool's state, the tenant's targets): the policy memoises its decisions, so
        # under load most requests repeat one of a few (the reason text and a new
        # `Decision` each time, else)
        self.kept: dict[tuple[Decision, PoolState, SloTarget], tuple[Decision, str]] = {}

    def decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        decision, kind = self._apply(self.inner.decide(profile, pools), profile, pools,
                                     explain=False)
        if self.metrics is not None:
            self.metrics.decided(kind)
        return decision

    def predict(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        return self._apply(self.inner.predict(profile, pools), profile, pools,
                           explain=True)[0]

    def observe(self, record: RequestRecord) -> None:
        self.inner.observe(record)

    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None:
        self.inner.set_worker_prior(pool, prior)

    def start(self) -> None:
        self.inner.start()

    def stop(self) -> None:
        self.inner.stop()

    def _apply(self, decision: Decision, profile: RequestProfile, pools: list[PoolView],
               explain: bool) -> tuple[Decision, str]:
        if not self.enabled or decision.predicted_tokens_per_s <= 0:
            return decision, "policy"
        tenant = self.tenants.get(profile.tenant, self.default)
        tpot_ms = 1000.0 / decision.predicted_tokens_per_s
        if tpot_ms <= tenant.slo_tpot_ms and not self._any_busy(pools):
            # the common case, kept cheap: a live decision keeps the policy's
            # reason as it is; explain says why it stands
            if not explain:
                return decision, "slo_kept"
            return with_reason(decision, f"{decision.reason}; slo {tenant.name}: meets "
                               f"(tpot {tpot_ms:.0f} ms <= {tenant.slo_tpot_ms:.0f} ms), "
                               f"no pool busy"), "slo_kept"
        picked = self.admission.pool_state(decision.pool, tenant)
        target = self._target(tenant)
        alone = not self._higher_anywhere(pools, tenant.priority)
        key = (decision, picked, target)
        known = self.kept.get(key) if alone else None
        if known is not None:
            return known
        pick = option(decision.pool, decision.method, decision.k,
                      decision.predicted_tokens_per_s, decision.predicted_accept_length,
                      picked)
        if alone and pick.meets(target):
            # nothing to yield to, and the pick meets: `choose` keeps it whatever the other
            # options say, so they (a state and a `predict` per pool) are not built; the
            # verdict depends on the key alone, so it is kept for the next such request
            choice = choose(pick, [], target)
            kept = with_reason(decision, f"{decision.reason}; {choice.reason}"), \
                f"slo_{choice.kind}"
            if len(self.kept) >= KEPT_VERDICTS:
                self.kept.clear()
            self.kept[key] = kept
            return kept
        states = {p.name: picked if p.name == decision.pool
                  else self.admission.pool_state(p.name, tenant) for p in pools}
        choice = choose(pick, self._options(profile, pools, states), target)
        reason = f"{decision.reason}; {choice.reason}"
        if not choice.changed:
            return with_reason(decision, reason), f"slo_{choice.kind}"
        chosen = choice.option
        fallbacks = tuple(dict.fromkeys(
            n for n in (decision.pool, *decision.fallbacks) if n != chosen.pool))
        return replace(decision, pool=chosen.pool, method=chosen.method, k=chosen.k,
                       reason=reason, predicted_accept_length=chosen.accept_length,
                       predicted_tokens_per_s=chosen.tokens_per_s,
                       fallbacks=fallbacks), f"slo_{choice.kind}"

    def _any_busy(self, pools: list[PoolView]) -> bool:
        busy = self.admission.busy
        for view in pools:  # a loop, not any(genexpr): asked on every request
            if busy(view.name):
                return True
        return False

    def _higher_anywhere(self, pools: list[PoolView], priority: int) -> bool:
        """Whether a request of a higher priority runs or waits in one of `pools`: without
        one no option holds higher-priority work, and `policies.slo.yielding` is false."""
        holds = self.admission.holds_higher
        for view in pools:  # a loop, not any(genexpr): asked on every request under load
            if holds(view.name, priority):
                return True
        return False

    def _target(self, tenant: TenantConfig) -> SloTarget:
        """The tenant's targets, built once per tenant config (a reload makes a new one)."""
        known = self.targets.get(tenant.name)
        if known is not None and known[0] is tenant:
            return known[1]
        target = SloTarget(tenant.name, tenant.slo_ttft_ms, tenant.slo_tpot_ms,
                           tenant.priority)
        self.targets[tenant.name] = (tenant, target)
        return target

    def _options(self, profile: RequestProfile, pools: list[PoolView],
                 states: dict[str, PoolState]) -> list[SloOption]:
        out = []
        for view in pools:
            if view.healthy_workers <= 0:
                continue
            variants = [view]
            if view.per_request_k and view.method != "plain" and view.k > 0:
                variants.append(replace(view, k=0, per_request_k=False, max_k=0))
            for variant in variants:
                d = self.inner.predict(profile, [variant])
                out.append(option(view.name, d.method, d.k, d.predicted_tokens_per_s,
                                  d.predicted_accept_length, states.get(view.name)))
        return out


IDLE = PoolState(False, 0.0, 0)  # a pool admission knows nothing of
KEPT_VERDICTS = 1024  # past this many, `SloAware.kept` starts again


def option(pool: str, method: str, k: int, tokens_per_s: float, accept_length: float,
           state: PoolState | None) -> SloOption:
    state = state or IDLE
    return SloOption(pool, method, k, tokens_per_s, accept_length, state.wait_s * 1000,
                     state.busy, state.higher_priority)


def with_reason(decision: Decision, reason: str) -> Decision:
    """`replace(decision, reason=reason)`, spelled out: a call under load that
    `dataclasses.replace` makes ~3 µs in Python (it reads the fields by name), the
    constructor ~1 (tests/gateway/routing/test_slo_aware.py checks the two agree)."""
    return Decision(decision.pool, decision.method, decision.k, reason,
                    decision.predicted_accept_length, decision.predicted_tokens_per_s,
                    decision.explored, decision.fallbacks, decision.pinned,
                    decision.accept_scale)

