"""The k each fixed-k pool should be relaunched with, published for its supervisor.

SGLang and vLLM fix k at launch, so the policy cannot choose it per request there; it
publishes, per pool, the k that maximises predicted tokens/s over the pool's traffic mix
(`policies.keys.desired_k_key`), and `workers.fleet.supervisor` relaunches the server
when it changes. A class's accept length at each k is read from the histogram of its
steps at the pool's current k where the pool reports one (`policies.accept_curve`: exact
below that k, the top positions' rate above it), else E(a, k): n-gram's acceptance comes
in runs, which E(a, k) misreads (on the trace world it predicted +6% for n-gram 8 -> 3
where the world measures -8%). A relaunch takes the pool out of service, so a change is asked for only
when it pays: predicted gain above max(`desired_k_gain`, `relaunch_cost_s /
relaunch_payback_s`), acceptance measured (not prior) for the contexts scored, the same
wish held for `relaunch_cost_s` of refits (a mix that lasts less than an outage is not
worth one), one pool at a time and none while another is out of service.

Against flapping (live, vLLM CPU n-gram: 4 -> 11 -> 4 in two minutes, each relaunch 93 s
out of service), three more rules:
- the k's scored stop `k_trust_margin` above the largest k the pool has served with
  telemetry (its current k before any), as on per-request-k pools: E(a, k) and the step
  cost are extrapolations far from the k's measured, and a fixed-k pool measures one;
- no wish while the pool's current k rests on fewer than `relaunch_min_samples`
  requests (just relaunched: what the new k does is not known yet);
- after a relaunch the pool keeps its k for `relaunch_payback_s` (the horizon the gain
  was to pay the outage back in): a relaunch that is undone before it has paid back
  its own outage cost two outages for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from policies.accept_curve import MIN_STEPS, curve
from policies.learner import PolicyState
from policies.telemetry import Telemetry
from policies.types import TASKS, PoolView


class RelaunchTerms(Protocol):
    """What the publisher reads of `policies.decision.PolicyConfig`, which owns them."""

    @property
    def desired_k_gain(self) -> float: ...
    @property
    def relaunch_cost_s(self) -> float: ...
    @property
    def relaunch_payback_s(self) -> float: ...
    @property
    def relaunch_min_samples(self) -> float: ...
    @property
    def refit_interval_s(self) -> float: ...
    @property
    def k_trust_margin(self) -> int | None: ...


class DesiredK:
    """Held wishes between refits; `publish` runs once per refit, off the request path."""

    def __init__(self, config: RelaunchTerms) -> None:
        self.config = config
        self._wishes: dict[str, tuple[int, int]] = {}  # pool -> (wished k, refits held)
        self._refits = 0
        self._changed: dict[str, tuple[int, int]] = {}  # pool -> (k asked for, at refit)

    @property
    def relaunch_gain(self) -> float:
        """Fractional tokens/s gain a fixed pool's new k must promise to be relaunched."""
        cfg = self.config
        return max(cfg.desired_k_gain, cfg.relaunch_cost_s / cfg.relaunch_payback_s)

    def publish(self, store: Telemetry, state: PolicyState, pools: dict[str, PoolView],
                load: Callable[[PoolView], float]) -> None:
        """Ask for at most one relaunch: the fixed-k pool with the largest predicted gain;
        every other pool (one without measured acceptance too) is told to keep its k.
        Nothing while a pool is out of service (relaunching): its published k must stand
        until it is back. `load(pool)`: requests per worker a request there would join."""
        fixed = [p for p in pools.values()
                 if not p.per_request_k and p.method != "plain"]
        if any(p.healthy_workers <= 0 for p in fixed):
            return
        self._refits += 1
        cfg = self.config
        settle = cfg.relaunch_payback_s / cfg.refit_interval_s
        wishes, held = {}, {}
        for pool in fixed:
            asked = self._changed.get(pool.name)
            if asked is not None and self._refits - asked[1] < settle:
                continue  # relaunched (or asked to be) within the payback horizon
            if state.pool_k_known.get((pool.name, pool.k), 0.0) < cfg.relaunch_min_samples:
                continue  # its current k is not measured yet
            scores = self.k_scores(pool, state, load(pool))
            if scores:
                best = max(scores, key=lambda k: (scores[k], -k))
                wishes[pool.name] = (best, scores[best] / max(scores[pool.k], 1e-12))
                if wishes[pool.name][1] > 1 + self.relaunch_gain:
                    k, n = self._wishes.get(pool.name, (best, 0))
                    held[pool.name] = (best, n + 1 if k == best else 1)
        self._wishes = held
        dwell = cfg.relaunch_cost_s / cfg.refit_interval_s
        change = max((n for n in held if held[n][1] >= dwell),
                     key=lambda n: wishes[n][1], default=None)
        if change is not None:
            self._changed[change] = (wishes[change][0], self._refits)
            self._wishes.pop(change, None)
        for pool in fixed:
            asked = self._changed.get(pool.name)
            # a k asked for stands until the pool runs it (the supervisor drains first)
            k = asked[0] if asked is not None and self._refits - asked[1] < settle else pool.k
            store.publish_desired_k(pool.name, k)

    def k_scores(self, pool: PoolView, state: PolicyState, load: float) -> dict[int, float]:
        """Predicted tokens/s of the pool's traffic mix at each k, at `load`; only
        contexts whose acceptance rests on `relaunch_min_samples` requests count."""
        if pool.healthy_workers <= 0:
            return {}
        mix = {key[1:]: n for key, n in state.traffic.items() if key[0] == pool.name}
        if not mix:
            for key, n in state.traffic.items():
                mix[key[1:]] = mix.get(key[1:], 0.0) + n
        top = max(pool.max_k, pool.k)
        if self.config.k_trust_margin is not None:
            top = min(top, max(state.measured_k.get(pool.name, 0), pool.k)
                      + self.config.k_trust_margin)
        ks = range(0, top + 1)
        measured: list[tuple[float, dict[int, float]]] = []  # traffic, accept length by k
        for (model, task, bucket), n in mix.items():
            if task not in TASKS:
                continue
            a, samples = state.accept(model, pool.method, task, bucket)
            if samples < self.config.relaunch_min_samples:
                continue
            histogram = state.accept_histograms.get((pool.name, pool.k, model, task, bucket))
            if histogram and sum(histogram) >= MIN_STEPS:  # measured at the pool's k
                measured.append((n, curve(histogram, pool.k, ks)))
            else:
                measured.append((n, {k: state.accept_length(a, pool.method, k) for k in ks}))
        if not measured:
            return {}
        cost = state.cost(pool.name)
        return {k: sum(n * lengths[k] for n, lengths in measured) / cost.step_s(k, load)
                for k in ks}
