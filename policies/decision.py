"""The routing policy: which pool, which k, or no speculation at all.

`decide` maximises predicted tokens/s = E(a, k) / step_time(k, load) over the pools the
gateway offers (E from arXiv 2211.17192; `a` and step time from the learner's latest
`PolicyState`, `a` scaled per request by the drafter predictor's `drafter_scales`,
policies/predictor.py). It only reads in-process state: the whole greedy ranking and its
decision are memoised per (context, each pool's identity, scale and load slot) until the next
refit, so a request is a lookup plus the exploration draw.

On a per-request-k pool k is chosen by what the worker's batch emits (with a measured
batch cost `options.mixed_batch`, else the batch gain `options.batch_gain`: SmartSpec's
goodput, arXiv 2406.14066), not by the request's own tokens/s, which hardly feels its
own k on a busy worker; pools are ranked by the request's own tokens/s at its best k.

Around the greedy choice:
- hysteresis: keep the fleet's incumbent (pool, k) for this context unless a challenger
  is predicted better by `hysteresis`; the incumbent is shared telemetry's (replicas agree);
- no speculation when the best predicted speedup over plain is below 1;
- cold start (`policies.cold_start`, within `explore_cap`; off with exploration, so
  replicas stay deterministic): a speculative pool with fewer than 3 requests in this
  context (not a per-request-k pool with measured step costs), a plain pool without
  any whose workers did not measure their step cost, is tried at its configured k;
- k trust region: on a per-request-k pool the k search stops `k_trust_margin` above the
  largest k measured on that pool (its configured k before any): E(a, k) and the step
  cost are least reliable far from the data. Tree drafters' E is taken at min(k, depth)
  (policies/acceptance.py) while the step cost pays for all k nodes;
- bounded exploration: with probability `explore_rate` (hard cap `explore_cap` of all
  requests) try the option with the highest optimistic (UCB, as in BanditSpec
  arXiv 2505.15141) tokens/s if it beats the greedy pick;
- for fixed-k pools, the k to relaunch them with: `policies.desired_k`.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass

from policies.acceptance import A_MAX, acceptance_std
from policies.aggregates import DECAY_TAU_S
from policies.cold_start import ColdStart
from policies.desired_k import DesiredK
from policies.learner import Learner, LearnerConfig, PolicyState
from policies.options import (
    LOAD_SLOTS,
    Option,
    evaluate,
    fallbacks,
    make_option,
    quantize_load,
    reason_line,
    trusted_top_k,
)
from policies.predictor import method_scale
from policies.prior import WorkerPrior, merge
from policies.telemetry import Telemetry
from policies.types import Decision, PoolView, RequestProfile, RequestRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    explore_rate: float = 0.02
    explore_cap: float = 0.05  # explored / decided never exceeds this
    hysteresis: float = 0.03
    ucb_z: float = 1.5
    refit_interval_s: float = 1.0
    desired_k_gain: float = 0.05  # republish a fixed pool's k only for a larger gain
    # A relaunch costs the pool's output for relaunch_cost_s; the gain must repay it
    # within relaunch_payback_s (the time a traffic mix is assumed to last).
    relaunch_cost_s: float = 60.0
    relaunch_payback_s: float = 600.0
    relaunch_min_samples: float = 20.0  # requests behind a context's acceptance
    cold_start_samples: float = 3.0  # tries per (pool, context): policies.cold_start
    k_trust_margin: int | None = 2  # k search limit above the largest measured k (None: off)
    # k per request by what it adds to its worker's batch (`batch_gain`), not by its own
    # tokens/s; off only for a world without co-batching (each request its own step)
    batch_aware_k: bool = True
    # per-request-k pools with a measured batch cost: k by the whole batch's output with
    # this context's share of it at k, the rest as they draft (`options.mixed_batch`);
    batch_mix: bool = True
    accept_tilt: bool = True  # and a read at each k along its slope (policies/kslope.py)
    # the load a decision assumes is at least the batch the pool's workers reported on the
    # gateway's latest answers (`PoolView.reported_batch`, fading in seconds; an earlier
    # floor from the telemetry's decayed sums moved only with new records of the pool, so a
    # pool left alone after a burst looked busy for minutes and stayed left alone)
    reported_load: bool = True
    # a no-speculation decision stays on a plain pool unless it is predicted this much slower
    plain_pool_margin: float = 0.25
    # scale pools' learned acceptance by the request's `drafter_scales`; off: class means only
    request_prediction: bool = True
    # acceptance learned per "class" (the request's scale against its class's mean) or per
    # "pool" (every class at once, `pooled_scales`: the prediction tells requests apart, the
    # pool's telemetry calibrates it); classes stay the unit of hysteresis and demand
    learning_unit: str = "class"
    seed: int = 0
    # Time constant of the telemetry's exponential decay: the gateway's store and the
    # simulator's both use it (the drift view decays 5x faster; docs/POLICY.md).
    decay_tau_s: float = DECAY_TAU_S
    learner: LearnerConfig = LearnerConfig()


LEARNING_UNITS = ("class", "pool")
RANKED_MEMO_SIZE = 4096  # (pools in their load slots, context) rankings kept per refit


@dataclass(frozen=True, slots=True)
class Ranked:
    options: list[Option]  # best first; shared by every request with the same key: read only
    chosen: Option  # the greedy pick
    plain_tps: float
    decision: Decision  # the greedy pick's decision (not explored)


class Policy:
    """The learned policy (module docstring); a `policies.protocol.RoutingPolicy`."""

    name = "learned"

    def __init__(self, store: Telemetry, config: PolicyConfig | None = None) -> None:
        self.store = store
        self.config = config or PolicyConfig()
        self.learner = Learner(self.config.learner,
                               pooled=self.config.learning_unit == LEARNING_UNITS[1])
        # Shared between the event loop (decide) and the learner thread (refit) only by
        # swapping whole objects, never by mutating one the other may be iterating: the
        # state and its option memo are replaced together, the pool map copy-on-write.
        state = PolicyState(default_accept=self.config.learner.default_accept)
        self._current: tuple[PolicyState, dict[tuple, Option], dict[tuple, Ranked]] = (
            state, {}, {})
        self._rng = random.Random(self.config.seed)
        self._pools: dict[str, PoolView] = {}  # never mutated: replaced by a copy
        # per pool, what its workers measured (`set_worker_prior`); replaced, never mutated
        self.worker_priors: dict[str, WorkerPrior] = {}
        self._decided = 0
        self._explored = 0
        self._cold = 0  # cold-start tries (under explore_cap, bounded per pool/context)
        self._tries = ColdStart(self.config.cold_start_samples, self.config.ucb_z,
                                self.config.learner.prior_weight)
        self.desired_k = DesiredK(self.config)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- request path -------------------------------------------------------------------
    def predict(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        """The greedy decision (hysteresis and the no-speculation rule included), and
        nothing else: no counters, no RNG draw, no exploration or cold-start try, no
        record of the pools. What `/v1/routing/explain` shows and pinned requests use."""
        return self._rank(*self._current, profile, pools).decision

    def decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        """`predict`, then bounded exploration and cold-start tries (counted)."""
        self._remember(pools)
        state, cache, memo = self._current
        ranked = self._rank(state, cache, memo, profile, pools)
        self._decided += 1
        context = (profile.model, profile.task, profile.temperature_bucket)
        chosen = self._cold_start(ranked, state, pools, context)
        if chosen is None and self._may_explore():
            loads = {p.name: self._load(state, p) for p in pools if p.healthy_workers > 0}
            chosen = (self._optimistic(ranked.options, ranked.chosen, state, loads, *context)
                      or self._nearby_k(ranked.chosen, state, loads))
            if chosen is not None:
                self._explored += 1
        if chosen is None:
            return ranked.decision
        return self._decision(ranked.options, chosen, profile, ranked.plain_tps, True)

    def _load(self, state: PolicyState, pool: PoolView) -> float:
        """Requests per worker the request would join: this gateway's count in flight, or
        what the pool's workers reported of their batches on its latest answers when that
        is more — other gateways (replicas, benchmarks) send to the same workers."""
        own = (pool.outstanding + 1) / pool.healthy_workers
        if not self.config.reported_load:
            return own
        return max(own, pool.reported_batch)

    def _remember(self, pools: list[PoolView]) -> None:
        """Every pool offered, out-of-service ones too (refit must know them); the map is
        copied, never changed in place, because the learner thread iterates it."""
        known = self._pools
        changed = {p.name: p for p in pools if known.get(p.name) != p}
        if changed:
            self._pools = {**known, **changed}

    def _rank(self, state: PolicyState, cache: dict[tuple, Option], memo: dict[tuple, Ranked],
              profile: RequestProfile, pools: list[PoolView]) -> Ranked:
        """Options by predicted tokens/s, the greedy pick, plain's tokens/s and the greedy
        decision: a pure function of the state and, per pool, its identity and load slot,
        so memoised with the state (a request whose pools sit in the same slots as an
        earlier one's is a lookup)."""
        model, task, bucket = profile.model, profile.task, profile.temperature_bucket
        scales = self._scales(profile)
        keys = []
        for pool in pools:
            if pool.healthy_workers > 0:
                # the pool's identity, not its live counters: they enter through the slot
                keys.append((pool.name, pool.method, pool.k, pool.per_request_k, pool.max_k,
                             model, task, bucket, method_scale(scales, pool.method),
                             quantize_load(self._load(state, pool))))
        whole = tuple(keys)
        ranked = memo.get(whole)
        if ranked is not None:
            return ranked
        if not keys:
            raise ValueError("no healthy pool to decide between")
        options = []
        by_name = {p.name: p for p in pools}
        for key in keys:
            option = cache.get(key)
            if option is None:
                pool = by_name[key[0]]
                option = cache[key] = evaluate(
                    state, pool, model, task, bucket, LOAD_SLOTS[key[-1]],
                    top_k=trusted_top_k(pool, state, self.config.k_trust_margin),
                    batch_aware=self.config.batch_aware_k, mix=self.config.batch_mix,
                    tilted=self.config.accept_tilt, scale=key[-2])
            options.append(option)
        options.sort(key=lambda o: (-o.pool_score, o.pool.name))
        chosen = self._with_hysteresis(state, options, (model, task, bucket))
        plain = [o for o in options if o.is_plain]
        plain_tps = plain[0].tokens_per_s if plain else chosen.plain_tokens_per_s
        if not chosen.is_plain and chosen.pool_score < plain_tps and plain:
            chosen = plain[0]
        if chosen.is_plain and chosen.pool.method != "plain":
            chosen = self._plain_pool(options, chosen)
        ranked = Ranked(options, chosen, plain_tps,
                        self._decision(options, chosen, profile, plain_tps, False))
        if len(memo) < RANKED_MEMO_SIZE:
            memo[whole] = ranked
        return ranked

    def _plain_pool(self, options: list[Option], chosen: Option) -> Option:
        """No speculation goes to a plain pool where there is one, unless it is predicted
        more than `plain_pool_margin` slower: its workers load no drafter and its batches
        never draft, and a speculative pool's worker stays free for the requests that
        speculate (the live benchmark's warm gateway sent its k = 0 decisions to the EAGLE
        pool, whose fit read its step at k = 0 as cheap as the plain pool's)."""
        dedicated = [o for o in options if o.pool.method == "plain"]
        if dedicated and dedicated[0].tokens_per_s >= chosen.tokens_per_s * (
                1.0 - self.config.plain_pool_margin):
            return dedicated[0]
        return chosen

    def _decision(self, options: list[Option], chosen: Option, profile: RequestProfile,
                  plain_tps: float, explored: bool) -> Decision:
        scale = method_scale(self._scales(profile), chosen.pool.method)
        return Decision(
            pool=chosen.pool.name, method=chosen.pool.method if chosen.k else "plain",
            k=chosen.k, reason=reason_line(chosen, profile.task, profile.temperature_bucket,
                                              plain_tps, explored, scale),
            predicted_accept_length=chosen.accept_length,
            predicted_tokens_per_s=chosen.tokens_per_s, explored=explored,
            fallbacks=fallbacks(options, chosen), accept_scale=scale if chosen.k else 1.0)

    def _scales(self, profile: RequestProfile) -> tuple[tuple[str, float], ...]:
        """The request's predicted scales against its learning unit's mean."""
        if not self.config.request_prediction:
            return ()
        return profile.pooled_scales if self.learner.pooled else profile.drafter_scales

    def observe(self, record: RequestRecord) -> None:
        """Hand a finished request to the store (enqueue only; learning happens in refit).
        Successful requests only: a failure carries no acceptance, and its tokens-free
        time would read as a very slow step."""
        if record.ok and record.output_tokens > 0:
            self.store.record(record)

    # -- helpers for decide --------------------------------------------------------------
    def _with_hysteresis(self, state: PolicyState, options: list[Option],
                         context: tuple[str, str, str]) -> Option:
        best = options[0]
        incumbent = state.incumbent.get(context)
        if incumbent is None or incumbent[0] == best.pool.name:
            return best
        for option in options:
            if option.pool.name == incumbent[0]:
                if best.pool_score < option.pool_score * (1 + self.config.hysteresis):
                    return option
                break
        return best

    def _cold_start(self, ranked: Ranked, state: PolicyState, pools: list[PoolView],
                    context: tuple[str, str, str]) -> Option | None:
        """A cold-start try (`policies.cold_start`) at the pool's configured k, within
        the exploration budget; None when there is none to make. Off with exploration,
        so replicas stay deterministic."""
        if self.config.explore_rate <= 0:
            return None
        if self._explored + self._cold + 1 > self.config.explore_cap * self._decided:
            return None  # tries share the exploration budget: never more than explore_cap
        option = self._tries.pick(ranked.options, state, context, ranked.chosen)
        if option is None:
            return None
        self._cold += 1
        pool = option.pool
        k = 0 if pool.method == "plain" else (min(pool.k, pool.max_k) if pool.per_request_k
                                               else pool.k)
        if k == option.k:
            return option
        live = next(p for p in pools if p.name == pool.name)  # the option's pool is cached
        return make_option(state, pool, k, option.accept, option.samples,
                           self._load(state, live))

    def _may_explore(self) -> bool:
        cfg = self.config
        spent = self._explored + self._cold  # cold-start tries share the budget
        if cfg.explore_rate <= 0 or spent + 1 > cfg.explore_cap * self._decided:
            return False
        return self._rng.random() < cfg.explore_rate

    def _optimistic(self, options: list[Option], chosen: Option, state: PolicyState,
                    loads: dict[str, float], model: str, task: str, bucket: str
                    ) -> Option | None:
        """The option whose optimistic tokens/s beats the pick by the most, if any."""
        best, best_tps = None, chosen.pool_score
        for option in options:
            if option.pool.name == chosen.pool.name or option.pool.method == "plain":
                continue
            samples = option.samples + self.config.learner.prior_weight  # prior's pseudo-counts
            upper = min(option.accept + self.config.ucb_z
                        * acceptance_std(option.accept, samples), A_MAX)
            load = loads[option.pool.name]
            hopeful = evaluate(
                state, option.pool, model, task, bucket, load, upper,
                top_k=trusted_top_k(option.pool, state, self.config.k_trust_margin),
                batch_aware=self.config.batch_aware_k, mix=self.config.batch_mix,
                tilted=self.config.accept_tilt)
            if hopeful.pool_score > best_tps and hopeful.k > 0:
                best, best_tps = (option, hopeful, load), hopeful.pool_score
        if best is None:
            return None
        option, hopeful, load = best  # predict with the estimate, not the optimistic a
        return make_option(state, option.pool, hopeful.k, option.accept, option.samples, load)

    def _nearby_k(self, chosen: Option, state: PolicyState, loads: dict[str, float]
                  ) -> Option | None:
        """A k a little off the pick on a per-request-k pool (1 or 2 from k = 0): the cost
        model only learns how step time grows with k at this load if k varies."""
        pool = chosen.pool
        if not pool.per_request_k or pool.method == "plain":
            return None
        top = trusted_top_k(pool, state, self.config.k_trust_margin)
        k = min(max(chosen.k + self._rng.choice((-2, -1, 1, 2)), 1), pool.max_k,
                top if top is not None else pool.max_k)
        if k == chosen.k:
            return None
        return make_option(state, pool, k, chosen.accept, chosen.samples, loads[pool.name])

    # -- learning, off the request path ----------------------------------------------------
    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None:
        """What a pool's workers measured about themselves (policies/prior.py); used from
        the next refit on, as the prior that telemetry then outweighs."""
        self.worker_priors = {**self.worker_priors, pool: prior}

    def refit(self) -> PolicyState:
        """Rebuild the state from the store's snapshot and publish fixed pools' desired k."""
        pools, measured = self._pools, self.worker_priors
        state = self.learner.fit(
            self.store.snapshot(), merge(m.acceptance for m in measured.values()),
            {pool: m.draft_cost for pool, m in measured.items() if m.draft_cost is not None},
            {pool: m.step_curve for pool, m in measured.items() if m.step_curve},
            {name: f"engine:{p.engine}" for name, p in pools.items() if p.per_request_k},
            (self.store.clock(), self.store.tau_s))
        self._current = (state, {}, {})
        self.desired_k.publish(self.store, state, pools,
                               lambda pool: self._load(state, pool))
        return state

    def start(self) -> None:
        """Refit every `refit_interval_s` in a daemon thread, never on the event loop."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="specroute-learner",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.config.refit_interval_s):
            try:
                self.refit()
            except Exception:  # a failed fit must not kill learning; keep the last state
                log.exception("policy refit failed")

    @property
    def state(self) -> PolicyState:
        return self._current[0]

    @property
    def explored_fraction(self) -> float:
        """Decisions that were not the greedy pick: exploration and cold-start tries."""
        return (self._explored + self._cold) / self._decided if self._decided else 0.0
