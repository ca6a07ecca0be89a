"""What the fleet planner plans from: per pool and class the tokens/s a request gets at a
load, and per class the arrival rate and output length (`demand_from_snapshot`, from the
telemetry's decayed sums).

Two sources of speed. `state_speed` reads only what the policy has learned through its
public state (`PolicyState.accept`, `accept_length` and the pools' fitted step costs): it
extrapolates E(a, k) and the step cost to k no pool has run. `measured_speed` reads the
launch benchmark of every (method, k) (`policies/planner/launch.py`), so a k is valued as
measured, never extrapolated, and the learned acceptance only carries a drift since the
benchmark (a re-trained target, a new prompt mix) as a ratio at the pool's k."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from policies.aggregates import ContextKey, ContextStats
from policies.cost import StepCost
from policies.learner import PolicyState
from policies.planner.launch import Benchmarked
from policies.planner.plan import DEFAULT_OUTPUT_TOKENS, ClassDemand, PoolSlot, Speed
from policies.types import TASKS


def state_speed(state: PolicyState, model: str,
                pools: Mapping[str, PoolSlot] | None = None) -> Speed:
    """s_pj(b) from the learner's state: E(a, k) at the class's blended acceptance for the
    pool's method over the pool's fitted step time at b requests per worker. A pool with
    no fit of its own (no workers yet) takes the fit of the fitted pool nearest in k,
    its method's first: the fleet-wide fit mixes pools at different k and, fixed-k pools
    each showing one k, can put all of a step's cost on the per-token term (a plain step
    predicted at ~0 s)."""
    costs = {name: _cost_for(state, slot, pools or {}) for name, slot in (pools or {}).items()}

    def speed(pool: PoolSlot, demand: ClassDemand, load: float) -> float:
        k = 0 if pool.method == "plain" else pool.k
        length = 1.0
        if k > 0:
            a, _ = state.accept(model, pool.method, demand.task, demand.bucket)
            length = state.accept_length(a, pool.method, k)
        cost = costs.get(pool.name) or state.cost(pool.name)
        return length / cost.step_s(k, load)

    return speed


def measured_speed(bench: Sequence[Benchmarked], state: PolicyState | None = None,
                   model: str = "") -> Speed:
    """s_pj(b) from the launch benchmark: the class's accept length measured at the
    pool's (method, k) over the step measured at b requests per worker. With `state`, a
    class whose acceptance the policy has learned from traffic (requests behind it) is
    scaled by E(learned a, k) / E(prior a, k) at the pool's k: the drift since the
    benchmark, not its shape in k. A configuration nobody benchmarked is worth nothing
    (the plan gives it no workers)."""
    by_config = {(b.method, 0 if b.method == "plain" else b.k): b for b in bench}

    def speed(pool: PoolSlot, demand: ClassDemand, load: float) -> float:
        k = 0 if pool.method == "plain" else pool.k
        measured = by_config.get((pool.method, k))
        if measured is None:
            return 0.0
        tokens_per_s = _length(measured, demand) / measured.step_at(load)
        if state is None or k <= 0:
            return tokens_per_s
        return tokens_per_s * _drift(state, model, pool.method, k, demand)

    return speed


def _length(measured: Benchmarked, demand: ClassDemand) -> float:
    """The class's accept length; a temperature bucket the benchmark did not run takes
    the mean over the buckets it ran for the task (T 0.5 between greedy and T 1)."""
    if measured.k <= 0:
        return 1.0
    found = measured.accept_length.get((demand.task, demand.bucket))
    if found is not None:
        return found
    same_task = [v for (task, _), v in measured.accept_length.items() if task == demand.task]
    return sum(same_task) / len(same_task) if same_task else 1.0


def _drift(state: PolicyState, model: str, method: str, k: int, demand: ClassDemand
           ) -> float:
    key = state.accept_key(model, method, demand.task, demand.bucket)  # the prior it stands for
    learned, requests = state.accept(model, method, demand.task, demand.bucket)
    if requests <= 0 or key not in state.prior:
        return 1.0
    before = state.accept_length(state.prior[key], method, k)
    return state.accept_length(learned, method, k) / max(before, 1e-9)


def _cost_for(state: PolicyState, pool: PoolSlot, pools: Mapping[str, PoolSlot]) -> StepCost:
    if pool.name in state.costs:
        return state.costs[pool.name]
    fitted = [p for p in pools.values() if p.name in state.costs]
    if not fitted:
        return state.cost(pool.name)
    nearest = min(fitted, key=lambda p: (p.method != pool.method, abs(p.k - pool.k), p.name))
    return state.costs[nearest.name]


def demand_from_snapshot(snapshot: Mapping[str, ContextStats], model: str, tau_s: float,
                         recent: bool = True) -> list[ClassDemand]:
    """Per (task, bucket) of `model`: arrival rate and mean output tokens from the
    telemetry's decayed sums (a decayed count is rate x time constant at steady state).
    `recent`: the fast view (time constant tau_s / 5), which follows a changing mix."""
    from policies.aggregates import RECENT_FRACTION

    n: dict[tuple[str, str], float] = {}
    tokens: dict[tuple[str, str], tuple[float, float]] = {}
    for key, stats in snapshot.items():
        ctx = ContextKey.decode(key)
        if ctx.model != model or ctx.task not in TASKS:
            continue
        view = stats.recent if recent and stats.recent is not None else stats
        cls = (ctx.task, ctx.temperature_bucket)
        n[cls] = n.get(cls, 0.0) + view.n
        t, k = tokens.get(cls, (0.0, 0.0))
        tokens[cls] = (t + view.tokens, k + view.known)
    tau = tau_s * (RECENT_FRACTION if recent else 1.0)
    out = []
    for (task, bucket), count in sorted(n.items()):
        if count <= 1e-6:
            continue
        t, known = tokens[(task, bucket)]
        out.append(ClassDemand(task, bucket, count / tau,
                               t / known if known > 1e-6 else DEFAULT_OUTPUT_TOKENS))
    return out
