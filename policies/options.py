"""One (pool, k) the policy may choose, predicted: tokens/s, accept length, and the grid
of loads and k's it is evaluated on (`policies.decision` ranks them).

E(a, k) from arXiv 2211.17192 (`policies.acceptance`); step time from the learner's
fitted `StepCost` (`policies.cost`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.cost import StepCost
from policies.learner import PolicyState
from policies.predictor import TRACE_K, scaled_accept
from policies.types import PoolView


@dataclass(frozen=True, slots=True)
class Option:
    pool: PoolView  # identity fields only; live counters may be stale (options are cached)
    k: int
    accept: float  # per-token acceptance used
    samples: float  # requests behind `accept`
    accept_length: float
    tokens_per_s: float
    plain_tokens_per_s: float  # this pool at k = 0 (for the speedup line)
    # what pools are ranked by: the request's own tokens/s at the pool's best k for it
    # (equal to tokens_per_s unless the batch gain chose a smaller k, see `batch_gain`)
    pool_score: float = 0.0

    @property
    def is_plain(self) -> bool:
        return self.k == 0


def make_option(state: PolicyState, pool: PoolView, k: int, a: float, samples: float,
                load: float, tilt: tuple[float, float] | None = None) -> Option:
    """One (pool, k) at acceptance `a` and per-worker `load`, predicted (tree drafters'
    accept length capped at their depth, policies/acceptance.py). The step cost's `k` is
    the batch's draft tokens per request (policies/cost.py): at k >= 1 the whole batch is
    taken at this k (every request of a context gets the same answer), at k = 0 the
    batch-mates at what the pool's traffic drafts (`mates_draft`)."""
    cost = state.cost(pool.name)
    e = state.accept_length(a, pool.method, k, tilt) if k > 0 else 1.0
    plain_step = cost.step_s(mates_draft(state, pool, load), load)
    tps = e / (cost.step_s(k, load) if k > 0 else plain_step)
    return Option(pool, k, a, samples, e, tps, 1.0 / plain_step, tps)


def mates_draft(state: PolicyState, pool: PoolView, load: float) -> float:
    """The batch's draft tokens per request for a request that does not speculate on this
    pool: its batch-mates draft what the pool's traffic drafts (telemetry), so plain
    decoding on a speculative pool's busy worker is slower than on the plain pool's — a
    step costs what the whole batch drafts (other gateways' traffic, other classes)."""
    if load <= 1.0:
        return 0.0
    return state.pool_draft_k.get(pool.name, 0.0) * (load - 1.0) / load


def mixed_batch(state: PolicyState, pool: PoolView, ks: Sequence[int], a: float, samples: float,
                load: float, share: float, tilt: tuple[float, float] | None = None) -> Option:
    """The k whose batch emits the most tokens/s on a worker of `load` requests, where
    this request and `share` of its batch-mates (its context's share of the batch's
    verify steps) run k and the other batch-mates draft what the batch drafts now
    (`pool_draft_k`) and emit what its group's requests emit per step
    (`group_accept_length`). With share 1 this is the k with the best tokens/s with the
    whole batch at k; with share 0 it is what one request adds to the batch (the
    simulator's oracle). Scored by the request's own tokens/s at that k."""
    cost = state.cost(pool.name)
    mates = max(load - 1.0, 0.0)
    moving = 1.0 + mates * share  # requests at this k, this one included
    rest = mates * (1.0 - share)
    draft = state.pool_draft_k.get(pool.name, 0.0)
    others = state.group_accept_length.get(pool.name)
    best: tuple[float, int, float, float] | None = None
    for k in ks:
        e = state.accept_length(a, pool.method, k, tilt) if k > 0 else 1.0
        step = cost.step_s((moving * k + rest * draft) / load if load > 0 else k, load)
        length = others if others is not None else e
        gain = (moving * e + rest * length) / step
        if best is None or gain > best[0]:
            best = (gain, k, e, step)
    assert best is not None, "ks is never empty"
    _, k, e, step = best
    plain_step = cost.step_s(rest * draft / load if load > 0 else 0.0, load)
    return Option(pool, k, a, samples, e, e / step, 1.0 / plain_step, e / step)


def batch_gain(option: Option, cost: StepCost, load: float, others_length: float) -> float:
    """Tokens/s the request's worker emits with this option, less what it would emit with
    the request at k = 0 (SmartSpec's goodput view, arXiv 2406.14066). With `load`
    requests in the batch (this one included) the others emit `others_length` tokens per
    step each; the cost model's per-token term is what one more draft token adds to the
    step, which every request in the batch pays. A request's own tokens/s hardly feels
    its own k on a busy worker, so maximising it picks large k that slow the whole batch
    (docs/POLICY.md, co-batching)."""
    rest = max(load - 1.0, 0.0) * others_length
    return ((rest + option.accept_length) / cost.step_s(option.k, load)
            - (rest + 1.0) / cost.step_s(0, load))


# Per-worker loads are memoised on a geometric grid (~7% apart) up to 512 per worker.
LOAD_SLOTS = tuple(1.07 ** i for i in range(93))


def quantize_load(load: float) -> int:
    """Index of the grid point nearest `load` (>= 1: the request itself is in the batch)."""
    if load <= 1.0:
        return 0
    return min(int(math.log(load) / math.log(1.07) + 0.5), len(LOAD_SLOTS) - 1)


def candidate_ks(pool: PoolView, top: int | None = None) -> range | tuple[int, ...]:
    """The k's a pool can run: one on fixed-k pools, 0..max_k (or ..`top`) otherwise."""
    if pool.method == "plain":
        return (0,)
    if not pool.per_request_k:
        return (pool.k,)
    return range(0, min(pool.max_k, top if top is not None else pool.max_k) + 1)


def trusted_top_k(pool: PoolView, state: PolicyState, margin: int | None) -> int | None:
    """The largest k worth predicting on a per-request-k pool: `margin` above the largest
    k measured there, or above its configured k (the operator's default) before any."""
    if margin is None:
        return None
    return max(state.measured_k.get(pool.name, 0), pool.k) + margin


def fallbacks(options: list[Option], chosen: Option) -> tuple[str, ...]:
    """The other pools by predicted tokens/s, plain last."""
    rest = [o for o in options if o.pool.name != chosen.pool.name]
    rest.sort(key=lambda o: (o.pool.method == "plain", -o.pool_score))
    return tuple(o.pool.name for o in rest)


def reason_line(option: Option, task: str, bucket: str, plain_tps: float,
                explored: bool, scale: float = 1.0) -> str:
    """The decision's one-line reason; `scale`: the request's predicted scale for the
    chosen pool's drafter family (policies/predictor.py), named when not 1."""
    method = option.pool.method if option.k else "plain"
    speedup = option.tokens_per_s / plain_tps if plain_tps > 0 else 1.0
    tag = " (exploring)" if explored else ""
    scaled = f", {scale:.2g}x its class's extra tokens" if option.k and scale != 1.0 else ""
    return (f"{task}/{bucket}: {option.pool.name} {method} k={option.k} predicted "
            f"{option.accept_length:.1f} tok/step{scaled}, {speedup:.1f}x plain{tag}")


def evaluate(state: PolicyState, pool: PoolView, model: str, task: str, bucket: str,
             load: float, accept: float | None = None, top_k: int | None = None,
             batch_aware: bool = True, mix: bool = False, tilted: bool = False,
             scale: float = 1.0) -> Option:
    """Measured batch cost (`PolicyState.cost_measured`): the k with which the
    worker's batch emits most, this context's share of it at k and the rest drafting
    what they draft (`options.mixed_batch`; `mix` off: the whole batch at k).
    Elsewhere (a per-token fit that seldom sees k vary at one load): the k >= 1 with
    the largest batch gain, or k = 0 where that is the request's own best — a gain at
    k = 0 stopped the fit seeing k vary, and a batch-1 per-token prior then held busy
    pools at k = 0 (the simulator's `embedded` fleet: 0.72 of the oracle, 0.89
    without). Scored (`pool_score`) by the request's own tokens/s at its own best k,
    so pools compare alike whatever their fits say about batch-mates. `tilted`: `a`
    read at each k along the context's slope in k (`PolicyState.accept_tilt`).
    `scale`: the request's predicted extra tokens per step against its class's (its
    learning unit's: policies/predictor.py), applied to the context's learned `a` (not to `accept`, an
    explicit acceptance such as exploration's optimistic one, already the request's)."""
    a, n = state.accept(model, pool.method, task, bucket)
    if accept is not None:
        a = accept
    elif scale != 1.0:
        a = scaled_accept(a, pool.method, scale, TRACE_K)
    ks = candidate_ks(pool, top_k)
    tilt = state.tilt(model, pool.method, task, bucket) if tilted and pool.per_request_k \
        else None
    options = [make_option(state, pool, k, a, n, load, tilt) for k in ks]
    own = max(options, key=lambda o: o.tokens_per_s)
    if mix and batch_aware and len(ks) > 1 and pool.name in state.cost_measured:
        share = state.batch_share.get((pool.name, model, task, bucket), 0.0)
        return scored(mixed_batch(state, pool, ks, a, n, load, share, tilt),
                      own.tokens_per_s)
    if (len(options) == 1 or not batch_aware or own.k == 0
            or pool.name in state.cost_measured):
        return own
    cost = state.cost(pool.name)
    others = state.pool_accept_length.get(pool.name, own.accept_length)
    best = max((o for o in options if o.k >= 1),
               key=lambda o: batch_gain(o, cost, load, others))
    return scored(best, own.tokens_per_s)


def scored(option: Option, pool_score: float) -> Option:
    """`option` ranked by `pool_score`: `dataclasses.replace`, spelled out, since it
    runs for every pool of every request and `replace` reads the fields by name in
    Python (~2.7 µs a call, against a compiled constructor call)."""
    return Option(option.pool, option.k, option.accept, option.samples, option.accept_length,
                  option.tokens_per_s, option.plain_tokens_per_s, pool_score)
