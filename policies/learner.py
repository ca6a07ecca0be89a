"""Learner: turns the telemetry snapshot into an immutable `PolicyState`.

Runs off the request path (the policy's background thread, or the simulator between
requests). Steps:
1. per acceptance context (model, method, task, temperature bucket), invert each k's
   mean accept length to a per-token `a` (arXiv 2211.17192) and pool them by verify steps;
   if the fast-decaying view disagrees with the long one beyond noise, trust the fast one
   (a drift: new checkpoint, new traffic);
2. fit the `AcceptancePrior` regressor on those contexts and precompute its prediction for
   every (model, method, task, bucket) the policy may be asked about, blended with the
   context's own estimate by request count;
3. fit a step-cost curve per pool (policies/cost.py);
4. note the incumbent (pool, k) per (model, task, bucket) — the option carrying most
   recent traffic fleet-wide — which the policy's hysteresis sticks to. It comes from
   shared telemetry, so replicas agree on it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from policies.acceptance import (
    TEMPERATURE_BUCKETS,
    AcceptancePrior,
    AcceptanceSample,
    blend,
    invert_accept_length,
)
from policies.aggregates import ContextKey, ContextStats
from policies.cost import StepCost, StepSample, fit_step_cost, generic_trend
from policies.types import TASKS

AcceptKey = tuple[str, str, str, str]  # model, method, task, temperature bucket


# Coarse per-method base rates for a cold start: the ordering the literature agrees on
# (EAGLE-3 > EAGLE-2 > EAGLE > Medusa ~ draft model > n-gram ~ lookahead; Spec-Bench and
# the EAGLE papers), deliberately not per task or temperature — telemetry learns those.
METHOD_BASE_ACCEPT = {"eagle3": 0.8, "eagle2": 0.75, "eagle": 0.7, "medusa": 0.6,
                      "draft": 0.6, "ngram": 0.4, "lookahead": 0.4}


@dataclass(frozen=True, slots=True)
class LearnerConfig:
    prior_weight: float = 5.0  # requests' worth of trust in the regressor's prior
    default_accept: float = 0.5  # a method with no base rate, before any data
    default_step_s: float = 0.02
    min_incumbent_requests: float = 3.0
    min_k_requests: float = 1.0  # requests at a k before it counts as measured
    # A gap in per-token acceptance between the recent and the long view that counts as
    # a drift: ~3 standard errors of a 10-request mean at typical accept lengths.
    drift_min_delta: float = 0.04
    drift_min_requests: float = 10.0
    method_base: tuple[tuple[str, float], ...] = tuple(METHOD_BASE_ACCEPT.items())

    def base_accept(self, method: str) -> float:
        return dict(self.method_base).get(method, self.default_accept)


@dataclass(frozen=True)
class PolicyState:
    """Everything `Policy.decide` reads; replaced wholesale, never mutated."""

    version: int = 0
    acceptance: dict[AcceptKey, tuple[float, float]] = field(default_factory=dict)  # a, n
    prior: dict[AcceptKey, float] = field(default_factory=dict)
    costs: dict[str, StepCost] = field(default_factory=dict)
    fleet_cost: StepCost = field(default_factory=lambda: generic_trend(0.02).curve())
    incumbent: dict[tuple[str, str, str], tuple[str, int]] = field(default_factory=dict)
    traffic: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    default_accept: float = 0.5
    method_base: dict[str, float] = field(default_factory=dict)
    # largest k each pool has served with telemetry behind it (>= `min_k_requests`): the
    # policy extrapolates E(a, k) and the step cost only a little beyond it
    measured_k: dict[str, int] = field(default_factory=dict)

    def accept(self, model: str, method: str, task: str, bucket: str) -> tuple[float, float]:
        """(blended a, request count) for a context; the prior when unseen."""
        key = (model, method, task, bucket)
        found = self.acceptance.get(key)
        if found is not None:
            return found
        return self.prior.get(key, self.method_base.get(method, self.default_accept)), 0.0

    def cost(self, pool: str) -> StepCost:
        return self.costs.get(pool, self.fleet_cost)


class Learner:
    def __init__(self, config: LearnerConfig | None = None) -> None:
        self.config = config or LearnerConfig()
        self._version = 0

    def fit(self, snapshot: dict[str, ContextStats],
            known_methods: Iterable[str] = ()) -> PolicyState:
        contexts = [(ContextKey.decode(key), stats) for key, stats in snapshot.items()
                    if stats.n > 1e-6]
        raw = self._acceptance(contexts)
        prior_model = AcceptancePrior(self.config.base_accept).fit([
            AcceptanceSample(key[1], key[2], key[3], k_mean, a, n)
            for key, (a, n, k_mean) in raw.items()])
        models = {key[0] for key in raw} or {""}
        methods = ({key[1] for key in raw} | set(known_methods)) - {"plain"}
        grid = [(m, meth, t, b) for m in models for meth in methods for t in TASKS
                for b in TEMPERATURE_BUCKETS]
        mean_k = {meth: statistics.fmean([v[2] for kk, v in raw.items() if kk[1] == meth] or [4])
                  for meth in methods}
        predicted = prior_model.predict_many((g[1], g[2], g[3], mean_k[g[1]]) for g in grid)
        prior = dict(zip(grid, predicted, strict=True))
        acceptance = {
            key: (blend(a, n, prior.get(key, self.config.base_accept(key[1])),  # type: ignore[arg-type]
                        self.config.prior_weight), n)
            for key, (a, n, _) in raw.items()}
        fleet_cost, costs = self._costs(contexts)
        incumbent, traffic = self._traffic(contexts)
        self._version += 1
        return PolicyState(self._version, acceptance, prior,  # type: ignore[arg-type]
                           costs, fleet_cost, incumbent,
                           traffic, self.config.default_accept, dict(self.config.method_base),
                           self._measured_k(contexts))

    def _measured_k(self, contexts: list[tuple[ContextKey, ContextStats]]) -> dict[str, int]:
        per_k: dict[tuple[str, int], float] = defaultdict(float)
        for ctx, stats in contexts:
            per_k[(ctx.pool, ctx.k)] += stats.known
        out: dict[str, int] = {}
        for (pool, k), n in per_k.items():
            if n >= self.config.min_k_requests:
                out[pool] = max(out.get(pool, 0), k)
        return out

    def _acceptance(self, contexts: list[tuple[ContextKey, ContextStats]]
                    ) -> dict[AcceptKey, tuple[float, float, float]]:
        """(a, requests, mean k) per acceptance context, k's pooled by verify steps; the
        recent view replaces the long one when they disagree beyond noise (a drift)."""
        long = self._pool_acceptance((ctx, stats) for ctx, stats in contexts)
        recent = self._pool_acceptance((ctx, stats.recent) for ctx, stats in contexts
                                       if stats.recent is not None)
        out = {}
        for key, (a, n, k_mean) in long.items():
            a_recent, n_recent, k_recent = recent.get(key, (a, 0.0, k_mean))
            drifted = (n_recent >= self.config.drift_min_requests
                       and abs(a_recent - a) > self.config.drift_min_delta)
            out[key] = (a_recent, n_recent, k_recent) if drifted else (a, n, k_mean)
        return out

    @staticmethod
    def _pool_acceptance(contexts: Iterable[tuple[ContextKey, ContextStats]]
                         ) -> dict[AcceptKey, tuple[float, float, float]]:
        sums: dict[AcceptKey, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for ctx, stats in contexts:
            if ctx.k <= 0 or ctx.method == "plain" or stats.steps <= 0:
                continue
            a = invert_accept_length(stats.accept_length, ctx.k)
            acc = sums[(ctx.model, ctx.method, ctx.task, ctx.temperature_bucket)]
            acc[0] += a * stats.steps
            acc[1] += stats.steps
            acc[2] += stats.known
            acc[3] += ctx.k * stats.steps
        return {key: (s[0] / s[1], s[2], s[3] / s[1]) for key, s in sums.items() if s[1] > 0}

    def _costs(self, contexts: list[tuple[ContextKey, ContextStats]]
               ) -> tuple[StepCost, dict[str, StepCost]]:
        per_pool: dict[str, list[StepSample]] = defaultdict(list)
        for ctx, stats in contexts:
            if stats.step_s > 0:
                per_pool[ctx.pool].append(StepSample(ctx.k, stats.mean_load, stats.step_s,
                                                     stats.known, ctx.load_bucket))
        everything = [s for samples in per_pool.values() for s in samples]
        base = (statistics.median(s.step_s for s in everything) if everything
                else self.config.default_step_s)
        fleet, fleet_trend = fit_step_cost(everything, generic_trend(base))
        return fleet, {pool: fit_step_cost(samples, fleet_trend)[0]
                       for pool, samples in per_pool.items()}

    def _traffic(self, contexts: list[tuple[ContextKey, ContextStats]]):
        options: dict[tuple[str, str, str], dict[tuple[str, int], float]] = defaultdict(
            lambda: defaultdict(float))
        traffic: dict[tuple[str, str, str, str], float] = defaultdict(float)
        for ctx, stats in contexts:
            options[(ctx.model, ctx.task, ctx.temperature_bucket)][(ctx.pool, ctx.k)] += stats.n
            traffic[(ctx.pool, ctx.model, ctx.task, ctx.temperature_bucket)] += stats.n
        incumbent = {}
        for key, by_option in options.items():
            best = max(sorted(by_option.items()), key=lambda item: item[1])
            if best[1] >= self.config.min_incumbent_requests:
                incumbent[key] = best[0]
        return incumbent, dict(traffic)
