"""The fleet planner: how many workers each fixed (method, k) pool of a model should have.

SGLang and vLLM fix the speculative method and k at launch, so on a fleet of such
servers the per-request choice is only among the pools that exist, and the split of
workers between pools is the larger lever. The planner picks that split from what the
policy has learned: the class mix and load (telemetry), each class's acceptance per
method and each pool's step cost (`PolicyState`, read through its public methods: `policies/planner/inputs.py`).

Model (one served model at a time; workers never change model):
- demand: classes j = (task, temperature bucket) with arrival rate r_j and mean output
  tokens T_j;
- a pool p with n_p workers serves a request of class j at s_pj(b) = E_pj / step_p(k, b)
  tokens/s, b its requests per worker, by Little's law b = sum_j x_jp r_j T_j / s_pj(b) / n_p
  (x_jp: the share of class j the router sends to p);
- the router sends each class where its requests go fastest; the shares are the
  equilibrium of that (method of successive averages: every round, move 1/(round + 1) of
  each class towards its fastest pool at the current loads);
- the fleet's value is the mean per-request tokens/s, sum_j r_j x_jp s_pj / sum_j r_j; a
  request slower than the SLO (seconds per output token) counts `slo_weight` of its speed;
  a pool past `max_batch` per worker queues, its speed scaled by max_batch / b (b capped
  at 4 max_batch: past capacity the queue has no steady state).

The plan maximises the value by local search (one worker moved per step) from the current
fleet, every single-pool fleet ("all in one pool", plain only included) and the previous
plan, adding workers only to pools whose k lies within the policy's trust region (at most
`k_trust_margin` above the largest k of the method running or measured); a split over several pools must beat the best single pool by `split_margin`, since
the model leaves out what splitting costs (misclassified requests reach the wrong pool,
small pools batch less evenly). The plan under way stands unless the new best beats it
by `hysteresis`. A move is a relaunch: the worker drains and serves nothing for
`relaunch_s`, and moves happen one at a time.
So the desired fleet is the stop on the way to the best fleet (one move at a time) with
the largest value integrated over `horizon_s` (the fleet short of the moving worker during
each relaunch, the new fleet after the last), and only if that beats keeping the current
fleet by `hysteresis` of its value; otherwise the desired fleet is the current one.
`settle` then adopts a change only once the planner has wished it for `dwell_s` (the
relaunch time by default): a mix that lasts less than a relaunch is not worth one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace

from policies.types import TASKS

Fleet = Mapping[str, int]  # pool name -> workers
OVERLOAD = 4.0  # an overloaded pool's queue is valued at this many times max_batch


@dataclass(frozen=True, slots=True)
class PoolSlot:
    """A pool the planner may give workers: one (method, k) of one model."""

    name: str
    method: str
    k: int


@dataclass(frozen=True, slots=True)
class ClassDemand:
    task: str
    bucket: str
    rate_per_s: float
    output_tokens: float


# (pool, class, requests per worker) -> tokens/s of one request of that class there
Speed = Callable[[PoolSlot, ClassDemand, float], float]


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    relaunch_s: float = 90.0  # a worker's drain + restart (docs/FLEET.md: SGLang start-up)
    horizon_s: float = 600.0  # how long a traffic mix is assumed to last
    hysteresis: float = 0.03  # net gain, as a fraction of the current value, to move
    min_workers: int = 1  # never fewer serving workers for the model
    max_batch: float = 256.0  # requests per worker before requests queue
    slo_s_per_token: float | None = None  # end-to-end seconds per output token
    slo_weight: float = 0.5  # what a token served slower than the SLO is worth
    rounds: int = 24  # successive-averages rounds per evaluation
    max_steps: int = 64  # local-search moves per plan
    # a split of the workers over pools must beat the best single pool by this much:
    # the model leaves out what splitting costs (classifier errors send requests to the
    # wrong pool, smaller pools batch less evenly)
    split_margin: float = 0.05
    # a new desired fleet is adopted once wished this long (None: relaunch_s)
    dwell_s: float | None = None
    # k trust region (the policy's `k_trust_margin`): no workers to a pool whose k is
    # more than this above its method's largest k running or measured (None: off)
    k_trust_margin: int | None = 2
    # before any traffic: plan for an even class mix at this many requests per worker
    # (0: keep the fleet as launched)
    cold_load: float = 8.0


@dataclass(frozen=True, slots=True)
class FleetValue:
    tokens_per_s: float  # mean per-request tokens/s predicted
    loads: dict[str, float]  # requests per worker, per pool with workers
    shares: dict[str, dict[str, float]]  # "task/bucket" -> pool -> share of the class


@dataclass(frozen=True, slots=True)
class FleetPlan:
    """The desired fleet with its reason; `current` is the fleet it was planned from."""

    model: str
    current: dict[str, int]
    desired: dict[str, int]
    current_tokens_per_s: float
    desired_tokens_per_s: float
    moves: int
    reason: str
    shares: dict[str, dict[str, float]] = field(default_factory=dict)
    wish: dict[str, int] = field(default_factory=dict)  # what the planner would move to
    wished_since: float = 0.0  # since when (its first move unchanged), clock of `settle`
    adopted: bool = True  # False: `desired` is the current fleet while the wish dwells

    @property
    def gain(self) -> float:
        return self.desired_tokens_per_s / max(self.current_tokens_per_s, 1e-12) - 1.0

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "gain": self.gain}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> FleetPlan:
        data = json.loads(raw)
        data.pop("gain", None)
        return cls(**data)


def _speed_at(speed: Speed, pool: PoolSlot, demand: ClassDemand, load: float,
              config: PlannerConfig) -> float:
    s = max(speed(pool, demand, max(load, 1.0)), 1e-9)
    if load > config.max_batch:
        s *= config.max_batch / load
    return s


def _loads(fleet: Fleet, pools: Mapping[str, PoolSlot], demand: list[ClassDemand],
           shares: list[dict[str, float]], speed: Speed, config: PlannerConfig
           ) -> dict[str, float]:
    """Requests per worker by Little's law, a damped fixed point per pool."""
    loads = {}
    for name, n in fleet.items():
        if n <= 0:
            continue
        b = 1.0
        for _ in range(12):
            busy = sum(share.get(name, 0.0) * d.rate_per_s * d.output_tokens
                       / _speed_at(speed, pools[name], d, b, config)
                       for d, share in zip(demand, shares, strict=True))
            b = min(0.5 * b + 0.5 * max(busy / n, 1.0), OVERLOAD * config.max_batch)
        loads[name] = b
    return loads


def evaluate(fleet: Fleet, pools: Mapping[str, PoolSlot], demand: list[ClassDemand],
             speed: Speed, config: PlannerConfig) -> FleetValue:
    """The fleet's predicted mean per-request tokens/s with the router at equilibrium."""
    live = [name for name in sorted(fleet) if fleet[name] > 0]
    if not live:
        return FleetValue(0.0, {}, {})
    shares = [{max(live, key=lambda p: _speed_at(speed, pools[p], d, 1.0, config)): 1.0}
              for d in demand]
    loads = _loads(fleet, pools, demand, shares, speed, config)
    for round_ in range(1, config.rounds + 1):
        step = 1.0 / (round_ + 1)
        for d, share in zip(demand, shares, strict=True):
            best = max(live, key=lambda p: _speed_at(speed, pools[p], d, loads[p], config))
            for p in share:
                share[p] *= 1.0 - step
            share[best] = share.get(best, 0.0) + step
        loads = _loads(fleet, pools, demand, shares, speed, config)
    total_rate = sum(d.rate_per_s for d in demand) or 1.0
    value = 0.0
    for d, share in zip(demand, shares, strict=True):
        for p, x in share.items():
            s = _speed_at(speed, pools[p], d, loads[p], config)
            slow = config.slo_s_per_token is not None and 1.0 / s > config.slo_s_per_token
            value += d.rate_per_s * x * s * (config.slo_weight if slow else 1.0)
    return FleetValue(value / total_rate, loads,
                      {f"{d.task}/{d.bucket}": {p: round(x, 3) for p, x in share.items()
                                                if x >= 0.001}
                       for d, share in zip(demand, shares, strict=True)})


def moves_between(current: Fleet, desired: Fleet) -> int:
    """Workers that must change pool to turn `current` into `desired`."""
    return sum(max(desired.get(p, 0) - current.get(p, 0), 0) for p in {*current, *desired})


def next_move(current: Fleet, desired: Fleet) -> tuple[str, str] | None:
    """The one move to make now: (from pool, to pool), the largest surplus to the largest
    deficit (ties by name), or None when the fleets agree."""
    names = sorted({*current, *desired})
    surplus = [p for p in names if current.get(p, 0) > desired.get(p, 0)]
    deficit = [p for p in names if current.get(p, 0) < desired.get(p, 0)]
    if not surplus or not deficit:
        return None
    src = max(surplus, key=lambda p: current.get(p, 0) - desired.get(p, 0))
    dst = max(deficit, key=lambda p: desired.get(p, 0) - current.get(p, 0))
    return src, dst


def _search(start: dict[str, int], names: list[str], targets: list[str],
            score: Callable[[Fleet], float], max_steps: int) -> tuple[dict[str, int], float]:
    best, best_value = dict(start), score(start)
    for _ in range(max_steps):
        improved = False
        for src in names:
            for dst in targets:
                if dst == src or best.get(src, 0) <= 0:  # (best changes in this loop)
                    continue
                trial = {**best, src: best[src] - 1, dst: best.get(dst, 0) + 1}
                value = score(trial)
                if value > best_value * (1.0 + 1e-6):
                    best, best_value, improved = trial, value, True
        if not improved:
            break
    return best, best_value


def trusted(pools: Mapping[str, PoolSlot], current: Fleet, measured_k: Mapping[str, int],
            margin: int | None) -> list[str]:
    """Pools the plan may add workers to: a pool's k at most `margin` above the largest k
    of its method measured (`PolicyState.measured_k`), else running now, as the
    policy trusts E(a, k) and the step cost only a little beyond the data (a method that
    nothing has run yet: from its smallest k)."""
    if margin is None:
        return sorted(pools)
    known: dict[str, int] = {}
    for name, slot in pools.items():  # measured: telemetry behind it
        if name in measured_k:
            k = max(slot.k, measured_k[name])
            known[slot.method] = max(known.get(slot.method, 0), k)
    running: dict[str, int] = {}
    for name, slot in pools.items():  # else what runs now (the operator's launch)
        if current.get(name, 0) > 0 and slot.method not in known:
            running[slot.method] = max(running.get(slot.method, 0), slot.k)
    known.update(running)
    for slot in pools.values():  # a method nothing has run yet: from its smallest k
        if slot.method not in known:
            known[slot.method] = min(p.k for p in pools.values() if p.method == slot.method)
    return sorted(name for name, slot in pools.items()
                  if slot.method == "plain" or slot.k <= known[slot.method] + margin)


def plan(model: str, current: Fleet, pools: Mapping[str, PoolSlot], demand: list[ClassDemand],
         speed: Speed, config: PlannerConfig, previous: Fleet | None = None,
         measured_k: Mapping[str, int] | None = None) -> FleetPlan:
    """The desired fleet for `model` (same total as `current`), with its reason;
    `measured_k`: the largest k each pool has served with telemetry behind it."""
    names = sorted(pools)
    now = {p: int(current.get(p, 0)) for p in names}
    total = sum(now.values())
    if total <= 0:
        return FleetPlan(model, now, now, 0.0, 0.0, 0, "no workers")
    prefix = ""
    if not demand or sum(d.rate_per_s for d in demand) <= 0:
        if config.cold_load <= 0:
            return FleetPlan(model, now, now, 0.0, 0.0, 0, "no traffic measured: keep")
        demand = cold_demand(total, speed, config)
        prefix = (f"no traffic measured, planned for an even class mix at "
                  f"{config.cold_load:g} requests per worker: ")
    cache: dict[tuple[int, ...], float] = {}

    def score(fleet: Fleet) -> float:
        key = tuple(fleet.get(p, 0) for p in names)
        if key not in cache:
            cache[key] = evaluate(fleet, pools, demand, speed, config).tokens_per_s
        return cache[key]

    targets = trusted(pools, now, measured_k or {}, config.k_trust_margin)
    starts = [now] + [{p: total if p == only else 0 for p in names} for only in targets]
    held = None
    if previous is not None and sum(previous.get(p, 0) for p in names) == total and all(
            previous.get(p, 0) <= now[p] for p in names if p not in targets):
        held = {p: int(previous.get(p, 0)) for p in names}
        starts.append(held)
    start = max(starts, key=score)
    best, best_value = _search(start, names, targets, score, config.max_steps)
    single = max(starts[1:len(targets) + 1], key=score)
    if sum(n > 0 for n in best.values()) > 1 and \
            best_value < score(single) * (1.0 + config.split_margin):
        best, best_value = single, score(single)  # a split must clearly beat one pool
    current_value = score(now)
    if moves_between(now, best) == 0:
        return _plan(model, now, now, current_value, current_value, 0,
                     prefix + "the current fleet is the best found", pools, demand, speed,
                     config)
    if total - 1 < config.min_workers:
        return _plan(model, now, now, current_value, current_value, 0,
                     f"keep: a move would leave fewer than {config.min_workers} workers",
                     pools, demand, speed, config)
    margin = config.hysteresis * current_value * config.horizon_s
    target, net, steps = _best_prefix(now, best, score, config)
    if held is not None and held != now and best != held:
        # the plan under way stands unless the new one is clearly better
        kept = _best_prefix(now, held, score, config)
        if kept[2] > 0 and kept[1] > 0 and net <= kept[1] + margin:
            best, best_value = held, score(held)
            target, net, steps = kept
            margin = 0.0
    if steps == 0 or net <= margin:
        return _plan(model, now, now, current_value, current_value, 0,
                     prefix + f"keep: {_describe(best)} would gain {best_value / current_value - 1:+.1%}"
                     f" but its relaunches of {config.relaunch_s:.0f} s each do not pay "
                     f"within {config.horizon_s:.0f} s", pools, demand, speed, config)
    value = score(target)
    return _plan(model, now, target, current_value, value, steps,
                 prefix + f"{_describe(target)}: {value / current_value - 1:+.1%} predicted "
                 f"tokens/s "
                 f"per request for {steps} relaunch(es)"
                 + (f" (on the way to {_describe(best)})" if target != best else ""),
                 pools, demand, speed, config)


def _best_prefix(now: dict[str, int], best: dict[str, int], score: Callable[[Fleet], float],
                 config: PlannerConfig) -> tuple[dict[str, int], float, int]:
    """Walk from `now` to `best` one move at a time (as the supervisors do) and keep the
    stop with the largest net value over the horizon: during move i the fleet serves
    without the moving worker for relaunch_s, after the last move it serves as the new
    fleet for what is left of the horizon; net = that integral - horizon x today's value."""
    base = score(now) * config.horizon_s
    fleet, accrued, elapsed = dict(now), 0.0, 0.0
    target, net, steps = dict(now), 0.0, 0
    for i in range(1, moves_between(now, best) + 1):
        move = next_move(fleet, best)
        if move is None or elapsed + config.relaunch_s > config.horizon_s:
            break
        src, dst = move
        accrued += config.relaunch_s * score({**fleet, src: fleet[src] - 1})
        elapsed += config.relaunch_s
        fleet = {**fleet, src: fleet[src] - 1, dst: fleet.get(dst, 0) + 1}
        total = accrued + (config.horizon_s - elapsed) * score(fleet) - base
        if total > net:
            target, net, steps = dict(fleet), total, i
    return target, net, steps


def settle(result: FleetPlan, previous: FleetPlan | None, now: float, dwell_s: float
           ) -> FleetPlan:
    """A change of the desired fleet takes effect once the planner has wished it (the same
    first move) for `dwell_s`: a mix that lasts less than a relaunch is not worth one, as
    for the policy's desired k. A plan already adopted goes on while the planner keeps
    wishing it."""
    if result.desired == result.current:
        return replace(result, wish=dict(result.desired), wished_since=now, adopted=True)
    if previous is not None and previous.adopted and previous.desired == result.desired:
        return replace(result, wish=dict(result.desired), wished_since=previous.wished_since,
                       adopted=True)
    first = next_move(result.current, result.desired)
    same = previous is not None and previous.wish and \
        next_move(result.current, previous.wish) == first
    since = previous.wished_since if same and previous is not None else now
    if now - since >= dwell_s:
        return replace(result, wish=dict(result.desired), wished_since=since, adopted=True)
    return replace(result, desired=dict(result.current),
                   desired_tokens_per_s=result.current_tokens_per_s, moves=0,
                   wish=dict(result.desired), wished_since=since, adopted=False,
                   reason=f"waiting ({now - since:.0f} of {dwell_s:.0f} s wished) for: "
                   + result.reason)


def _plan(model: str, now: dict[str, int], desired: dict[str, int], current_value: float,
          desired_value: float, moves: int, reason: str, pools: Mapping[str, PoolSlot],
          demand: list[ClassDemand], speed: Speed, config: PlannerConfig) -> FleetPlan:
    shares = evaluate(desired, pools, demand, speed, config).shares
    return FleetPlan(model, now, desired, current_value, desired_value, moves, reason, shares)


def _describe(fleet: Fleet) -> str:
    return ", ".join(f"{p} x{n}" for p, n in sorted(fleet.items()) if n > 0)


DEFAULT_OUTPUT_TOKENS = 256.0


def cold_demand(workers: int, speed: Speed, config: PlannerConfig) -> list[ClassDemand]:
    """Before any traffic: every (task, temperature bucket) alike, at the rate that keeps
    `cold_load` requests per worker busy on plain decoding (Little's law)."""
    from policies.acceptance import TEMPERATURE_BUCKETS

    classes = [(task, bucket) for task in TASKS for bucket in TEMPERATURE_BUCKETS]
    busy = workers * config.cold_load / len(classes)  # requests in flight per class
    probe = PoolSlot("plain", "plain", 0)
    out = []
    for task, bucket in classes:
        tokens_per_s = speed(probe, ClassDemand(task, bucket, 1.0, DEFAULT_OUTPUT_TOKENS),
                             config.cold_load)
        out.append(ClassDemand(task, bucket, busy * tokens_per_s / DEFAULT_OUTPUT_TOKENS,
                               DEFAULT_OUTPUT_TOKENS))
    return out
