"""Learner: turns the telemetry snapshot into an immutable `PolicyState`.

Runs off the request path (the policy's background thread, or the simulator between
requests). Steps:
1. per acceptance context (model, method, task, temperature bucket), invert each k's
   mean accept length to a per-token `a` (arXiv 2211.17192) and pool them by verify steps;
   if the fast-decaying view disagrees with the long one beyond noise, trust the fast one
   (a drift: new checkpoint, new traffic);
2. blend each with its prior by request count — every request the context ever had,
   not the decayed count (the estimate follows recent traffic; the prior must not win
   back its weight as time passes): what the pool's workers measured about themselves
   (policies/prior.py), else a flat `default_accept`, the same for every method;
3. fit a step-cost curve per pool (policies/cost.py), starting a pool whose workers
   measured their relative draft cost from that;
4. note the incumbent (pool, k) per (model, task, bucket) — the option carrying most
   recent traffic fleet-wide — which the policy's hysteresis sticks to. It comes from
   shared telemetry, so replicas agree on it.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from policies.acceptance import (
    blend,
    draft_depth,
    invert_method_accept_length,
    method_accept_length,
    observed_depth,
)
from policies.aggregates import ContextKey, ContextStats
from policies.cost import (
    Ratios,
    StepCost,
    StepSample,
    Trend,
    curve_ratios,
    fit_step_cost,
    generic_trend,
)
from policies.kslope import KWindow, Tilt, tilted_accept
from policies.methods import TREE_DEPTH
from policies.prior import AcceptKey, CurvePoint
from policies.types import ANY_TASK


@dataclass(frozen=True, slots=True)
class LearnerConfig:
    prior_weight: float = 5.0  # requests' worth of trust in a context's prior
    default_accept: float = 0.5  # flat prior, every method alike, where no worker measured
    default_step_s: float = 0.02
    min_incumbent_requests: float = 3.0
    min_k_requests: float = 1.0  # requests at a k before it counts as measured
    # A gap in per-token acceptance between the recent and the long view that counts as
    # a drift: ~3 standard errors of a 10-request mean at typical accept lengths.
    drift_min_delta: float = 0.04
    drift_min_requests: float = 10.0
    # acceptance rising with k (policies/kslope.py): the slope of logit(a) in log k
    # between k's served at once, shrunk by `tilt_ridge` (in the variance of log k)
    tilt_ridge: float = 0.02
    tilt_range: tuple[float, float] = (-0.5, 1.0)
    # the last seconds' acceptance (policies/kslope.py's fresh view) replaces the estimate
    # where it rests on this many requests and differs by more than `drift_min_delta`
    fresh_min_requests: float = 10.0


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
    # largest k each pool has served with telemetry behind it (>= `min_k_requests`): the
    # policy extrapolates E(a, k) and the step cost only a little beyond it
    measured_k: dict[str, int] = field(default_factory=dict)
    # tree drafters' accepted depth: the table's, raised where telemetry proves deeper
    depths: dict[str, int] = field(default_factory=lambda: dict(TREE_DEPTH))
    # tokens per verify step of the requests each pool served (every k, plain included):
    # what the rest of a batch emits per step, for the policy's batch-gain choice of k
    pool_accept_length: dict[str, float] = field(default_factory=dict)
    # pools whose per-token cost at each load rests on their workers' batch benchmark
    cost_measured: frozenset[str] = frozenset()
    # per pool, the draft tokens per request per step of the batches its requests rode
    pool_draft_k: dict[str, float] = field(default_factory=dict)
    # requests with reported steps per (pool, k), decayed: how well each k a pool ran is
    # measured (a fixed-k pool's desired k waits for its current k to be measured)
    pool_k_known: dict[tuple[str, int], float] = field(default_factory=dict)
    # per (pool, model, task, bucket): the context's share of the verify steps of the
    # batches it rides (its pool's recent steps over its co-batching group's: per-request-k
    # pools of one engine, `Learner.fit`'s `groups`); per pool, the group's recent tokens
    # per verify step (what a request's batch-mates emit)
    batch_share: dict[tuple[str, str, str, str], float] = field(default_factory=dict)
    group_accept_length: dict[str, float] = field(default_factory=dict)
    # per acceptance context: how its a rises with k (policies/kslope.py)
    accept_tilt: dict[AcceptKey, Tilt] = field(default_factory=dict)
    # per (pool, k, model, task, bucket): decayed decode steps by draft tokens accepted,
    # where workers counted them (policies/accept_curve.py)
    accept_histograms: dict[tuple[str, int, str, str, str], tuple[float, ...]] = field(
        default_factory=dict)
    # one acceptance per (model, method, bucket) for every class (`ANY_TASK`): the
    # learning unit is the pool, the request's pooled scale tells requests apart
    pooled: bool = False

    def accept_key(self, model: str, method: str, task: str, bucket: str) -> AcceptKey:
        """The acceptance context a request of class `task` reads: its class's, or every
        class's (`ANY_TASK`) when pooled."""
        return (model, method, ANY_TASK if self.pooled else task, bucket)

    def accept(self, model: str, method: str, task: str, bucket: str) -> tuple[float, float]:
        """(blended a, request count) for a context; the prior when unseen."""
        key = self.accept_key(model, method, task, bucket)
        found = self.acceptance.get(key)
        if found is not None:
            return found
        return self.prior.get(key, self.default_accept), 0.0

    def tilt(self, model: str, method: str, task: str, bucket: str) -> Tilt | None:
        """The context's slope of a in k (policies/kslope.py), None if not fitted."""
        return self.accept_tilt.get(self.accept_key(model, method, task, bucket))

    def cost(self, pool: str) -> StepCost:
        return self.costs.get(pool, self.fleet_cost)

    def accept_length(self, a: float, method: str, k: int, tilt: Tilt | None = None
                      ) -> float:
        """Expected tokens per verify step of `method` at k (tree depth capped); with a
        `tilt`, `a` is read at k's depth along the context's slope in k."""
        if tilt is not None and k > 0:
            a = tilted_accept(a, draft_depth(method, k, self.depths), tilt)
        return method_accept_length(a, method, k, self.depths)


class Learner:
    def __init__(self, config: LearnerConfig | None = None, pooled: bool = False) -> None:
        """`pooled`: learn acceptance per (model, method, bucket) for every class at once
        (`ANY_TASK`), the prior being the mean of the classes' priors."""
        self.config = config or LearnerConfig()
        self.pooled = pooled
        self._version = 0
        self._window = KWindow(self.config.tilt_ridge, self.config.tilt_range,
                               pooled=pooled)
        self._no_tilt_until: dict[AcceptKey, float] = {}
        self._now, self._tau = 0.0, 0.0

    def fit(self, snapshot: dict[str, ContextStats],
            prior: Mapping[AcceptKey, float] | None = None,
            draft_cost: Mapping[str, float] | None = None,
            step_curves: Mapping[str, Sequence[CurvePoint]] | None = None,
            groups: Mapping[str, str] | None = None,
            clock: tuple[float, float] | None = None) -> PolicyState:
        """`prior`: per-context acceptance the workers measured (policies/prior.py);
        `draft_cost`: per pool, a drafted token's cost as a fraction of a plain step;
        `step_curves`: per pool, the step cost across batch sizes its workers measured;
        `groups`: per pool, the pools whose requests share its batches (the policy
        passes per-request-k pools by engine; a pool not in it is its own group);
        `clock`: (now, the telemetry's tau) — without it no slope of a in k is fitted."""
        contexts = [(ContextKey.decode(key), stats) for key, stats in snapshot.items()
                    if stats.n > 1e-6]
        prior = dict(prior or {})
        if self.pooled:
            prior.update(pooled_prior(prior))
        default = self.config.default_accept
        depths = self._depths(contexts)
        evidence = self._evidence(contexts)
        tilts = self._window.update(snapshot, *clock, depths) if clock is not None else {}
        self._now, self._tau = clock if clock is not None else (0.0, 0.0)
        acceptance = {
            key: (blend(a, evidence.get(key, n), prior.get(key, default),
                        self.config.prior_weight), n)
            for key, (a, n, _) in self._acceptance(contexts, depths, groups or {}).items()}
        tilts = {key: tilt for key, tilt in tilts.items()
                 if self._now >= self._no_tilt_until.get(key, -math.inf)}
        fleet_cost, costs = self._costs(contexts, draft_cost or {}, step_curves or {})
        incumbent, traffic = self._traffic(contexts)
        share, group_length = self._batch_mix(contexts, groups or {})
        self._version += 1
        return PolicyState(self._version, acceptance, prior, costs, fleet_cost, incumbent,
                           traffic, default, self._measured_k(contexts), depths,
                           self._pool_accept_length(contexts),
                           frozenset(p for p, points in (step_curves or {}).items() if points),
                           self._pool_draft_k(contexts), self._per_k(contexts),
                           share, group_length, tilts,
                           accept_histograms=self._histograms(contexts), pooled=self.pooled)

    @staticmethod
    def _batch_mix(contexts: list[tuple[ContextKey, ContextStats]], groups: Mapping[str, str]
                   ) -> tuple[dict[tuple[str, str, str, str], float], dict[str, float]]:
        """Each (pool, model, task, bucket)'s share of its group's verify steps (a step
        is a request's seat in a batch) and each pool's group's tokens per verify step,
        from the recent view: what the batches hold now, not minutes ago."""
        def group_of(pool: str) -> str:  # a pool in no group is its own
            return groups.get(pool, "pool:" + pool)

        steps: dict[tuple[str, str, str, str], float] = defaultdict(float)
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for ctx, long in contexts:
            stats = long.recent if long.recent is not None else long
            if stats.steps > 0:
                steps[(ctx.pool, ctx.model, ctx.task, ctx.temperature_bucket)] += stats.steps
                group = sums[group_of(ctx.pool)]
                group[0] += stats.tokens
                group[1] += stats.steps
        share = {key: n / sums[group_of(key[0])][1]
                 for key, n in steps.items()}
        length = {}
        for pool in {ctx.pool for ctx, _ in contexts}:
            tokens, n = sums.get(group_of(pool), (0.0, 0.0))
            if n > 0:
                length[pool] = tokens / n
        return share, length

    @staticmethod
    def _histograms(contexts: list[tuple[ContextKey, ContextStats]]
                    ) -> dict[tuple[str, int, str, str, str], tuple[float, ...]]:
        """Each (pool, k, model, task, bucket)'s histogram, summed over load buckets."""
        sums: dict[tuple[str, int, str, str, str], list[float]] = {}
        for ctx, stats in contexts:
            if ctx.k <= 0 or not stats.histogram:
                continue
            key = (ctx.pool, ctx.k, ctx.model, ctx.task, ctx.temperature_bucket)
            acc = sums.setdefault(key, [])
            acc.extend([0.0] * (len(stats.histogram) - len(acc)))
            for j, steps in enumerate(stats.histogram):
                acc[j] += steps
        return {key: tuple(h) for key, h in sums.items()}

    def _evidence(self, contexts: list[tuple[ContextKey, ContextStats]]
                  ) -> dict[AcceptKey, float]:
        """Requests ever behind each acceptance context, undecayed: what the prior is
        weighed against. The estimate itself follows the decayed sums, but a prior is what
        was known before any traffic, and a decayed count handed it its weight back: on a
        slow pool (one request every 6 s, classes in turn) 50 edits had decayed to ~5
        requests by the time they were read, the flat prior (weight 5) took half the
        estimate and the policy predicted 2.7 tokens a step for edits vLLM served at 4.5."""
        out: dict[AcceptKey, float] = defaultdict(float)
        for ctx, stats in contexts:
            if ctx.k > 0 and ctx.method != "plain" and stats.steps > 0:
                out[ctx.accept_key(self.pooled)] += stats.evidence
        return dict(out)

    def _depths(self, contexts: list[tuple[ContextKey, ContextStats]]) -> dict[str, int]:
        """TREE_DEPTH, raised per method where a context's mean accept length (with
        `min_k_requests` behind it) is longer than the table's depth allows."""
        depths = dict(TREE_DEPTH)
        for ctx, stats in contexts:
            if ctx.method in depths and stats.known >= self.config.min_k_requests:
                seen = observed_depth(ctx.method, ctx.k, stats.accept_length)
                depths[ctx.method] = max(depths[ctx.method], seen)
        return depths

    @staticmethod
    def _pool_accept_length(contexts: list[tuple[ContextKey, ContextStats]]
                            ) -> dict[str, float]:
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for ctx, stats in contexts:
            if stats.steps > 0:
                sums[ctx.pool][0] += stats.tokens
                sums[ctx.pool][1] += stats.steps
        return {pool: tokens / steps for pool, (tokens, steps) in sums.items()}

    @staticmethod
    def _pool_draft_k(contexts: list[tuple[ContextKey, ContextStats]]) -> dict[str, float]:
        sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for ctx, stats in contexts:
            if stats.known > 0:
                sums[ctx.pool][0] += (ctx.k + stats.mean_batch_dk) * stats.known
                sums[ctx.pool][1] += stats.known
        return {pool: max(total / n, 0.0) for pool, (total, n) in sums.items() if n > 0}

    @staticmethod
    def _per_k(contexts: list[tuple[ContextKey, ContextStats]]) -> dict[tuple[str, int], float]:
        per_k: dict[tuple[str, int], float] = defaultdict(float)
        for ctx, stats in contexts:
            per_k[(ctx.pool, ctx.k)] += stats.known
        return dict(per_k)

    def _measured_k(self, contexts: list[tuple[ContextKey, ContextStats]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for (pool, k), n in self._per_k(contexts).items():
            if n >= self.config.min_k_requests:
                out[pool] = max(out.get(pool, 0), k)
        return out

    def _acceptance(self, contexts: list[tuple[ContextKey, ContextStats]],
                    depths: Mapping[str, int], grouped: Mapping[str, str] | None = None
                    ) -> dict[AcceptKey, tuple[float, float, float]]:
        """(a, requests, mean k) per acceptance context, k's pooled by verify steps; the
        recent view replaces the long one when they disagree beyond noise (a drift), and
        the fresh view (policies/kslope.py) replaces either likewise for contexts served
        on `grouped` pools (per-request-k: on fixed-k fleets it moved requests between
        pools sooner and cost the fine-tuned phase 0.5%). Either marks the context as
        drifted: no slope in k is fitted for it for the telemetry's time constant."""
        fast = {c.accept_key(self.pooled) for c, _ in contexts if c.pool in (grouped or {})}
        long = self._pool_acceptance(((ctx, stats) for ctx, stats in contexts), depths)
        recent = self._pool_acceptance(((ctx, stats.recent) for ctx, stats in contexts
                                        if stats.recent is not None), depths)
        out = {}
        for key, (a, n, k_mean) in long.items():
            a_recent, n_recent, k_recent = recent.get(key, (a, 0.0, k_mean))
            drifted = (n_recent >= self.config.drift_min_requests
                       and abs(a_recent - a) > self.config.drift_min_delta)
            out[key] = (a_recent, n_recent, k_recent) if drifted else (a, n, k_mean)
            fresh = self._window.fresh.get(key)
            if (fresh is not None and fresh[2] >= self.config.fresh_min_requests
                    and abs(fresh[0] / fresh[1] - out[key][0]) > self.config.drift_min_delta):
                if key in fast:
                    out[key] = (fresh[0] / fresh[1], fresh[2], out[key][2])
                drifted = True
            if drifted:  # no slope in k for a while: its data mix the two regimes
                self._no_tilt_until[key] = self._now + self._tau
        return out

    def _pool_acceptance(self, contexts: Iterable[tuple[ContextKey, ContextStats]],
                         depths: Mapping[str, int]
                         ) -> dict[AcceptKey, tuple[float, float, float]]:
        sums: dict[AcceptKey, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for ctx, stats in contexts:
            if ctx.k <= 0 or ctx.method == "plain" or stats.steps <= 0:
                continue
            a = invert_method_accept_length(stats.accept_length, ctx.method, ctx.k, depths)
            acc = sums[ctx.accept_key(self.pooled)]
            acc[0] += a * stats.steps
            acc[1] += stats.steps
            acc[2] += stats.known
            acc[3] += ctx.k * stats.steps
        return {key: (s[0] / s[1], s[2], s[3] / s[1]) for key, s in sums.items() if s[1] > 0}

    def _costs(self, contexts: list[tuple[ContextKey, ContextStats]],
               draft_cost: Mapping[str, float],
               step_curves: Mapping[str, Sequence[CurvePoint]]
               ) -> tuple[StepCost, dict[str, StepCost]]:
        """Per pool: its samples, starting from the fleet's trend — with the per-token
        cost its workers measured (relative to a plain step) where they did, and its
        per-token cost pulled to the fraction of plain's step their batch benchmark
        measured at each load, where they ran one."""
        per_pool: dict[str, list[StepSample]] = defaultdict(list)
        for ctx, stats in contexts:
            if stats.step_s > 0:
                batch_k = ctx.k + stats.mean_batch_dk
                per_pool[ctx.pool].append(StepSample(batch_k, stats.mean_load, stats.step_s,
                                                     stats.known, ctx.load_bucket))
        everything = [s for samples in per_pool.values() for s in samples]
        base = (statistics.median(s.step_s for s in everything) if everything
                else self.config.default_step_s)
        fleet, fleet_trend = fit_step_cost(everything, generic_trend(base))

        def start(pool: str) -> Trend:
            c = draft_cost.get(pool)
            if c is None:
                return fleet_trend
            return Trend(fleet_trend.b0, fleet_trend.b1, c * fleet_trend.b0,
                         c * fleet_trend.b0)  # generic_trend's shape: triples by 64

        def ratios(pool: str) -> Ratios | None:
            points = step_curves.get(pool)
            if not points:
                return None
            return curve_ratios([(p.batch, p.base, p.per_token, p.overhead) for p in points])

        return fleet, {pool: fit_step_cost(per_pool.get(pool, []), start(pool),
                                           ratios=ratios(pool))[0]
                       for pool in {*per_pool, *draft_cost, *step_curves}}

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


def pooled_prior(prior: Mapping[AcceptKey, float]) -> dict[AcceptKey, float]:
    """Per (model, method, bucket), the mean of its classes' priors, as `ANY_TASK`'s."""
    per: dict[AcceptKey, list[float]] = defaultdict(list)
    for (model, method, task, bucket), a in prior.items():
        if task != ANY_TASK:
            per[(model, method, ANY_TASK, bucket)].append(a)
    return {key: statistics.fmean(values) for key, values in per.items()}
