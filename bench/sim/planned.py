"""The deployable fixed-k fleet with the fleet planner (policies/planner/) in the loop.

Workers move between fixed (method, k) pools: the fleet starts as the static split of
`sglang-pools` (what the operator configured: with no traffic measured the planner keeps
it), and every `plan_interval_s` the planner re-plans from what the learned policy knows
(its `PolicyState` and telemetry snapshot, the same ones the gateway's planner reads).
One worker moves at a time, as the supervisors do: it takes no new requests, finishes
those it has (drain), is down for the relaunch time, then serves in its new pool; only
then may the next one move. Requests are routed by the learned policy over the pools
that have workers.

Relaunch time: SGLang's measured start-up, `SGLANG_RELAUNCH_S` (docs/FLEET.md gives the
figure's sources).

Two speed sources for the planner (policies/planner/inputs.py): the learned state alone
(`planner*` rows, on `planned_scenario`'s pools), or the launch benchmark of every
(method, k) with the learned acceptance as a drift (`planner-measured*` rows, on
`measured_scenario`'s pools: the configurations some class or the even mix measured best
at some batch, plus plain).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.sim import relaunch
from bench.sim.baselines import Learned
from bench.sim.launch import even_mix, launch_bench, pool_priors
from bench.sim.measure import BENCH_BATCHES
from bench.sim.scenarios import FLEET_WORKERS, SGLANG_POOLS, SGLANG_RELAUNCH_S, Scenario
from bench.sim.simulator import Fleet, Relaunches, Worker
from bench.sim.types import SimPool
from bench.sim.world import World
from policies.planner import (
    Benchmarked,
    FleetPlan,
    PlannerConfig,
    PoolSlot,
    candidate_configs,
    demand_from_snapshot,
    measured_speed,
    next_move,
    plan,
    settle,
    state_speed,
)
from policies.prior import WorkerPrior
from policies.types import PoolView


# The static split's pools, plus EAGLE-3 at the other k of the fixed baselines' grid
# (bench/sim/evaluation.py FIXED_KS), with no workers to begin with: the planner may
# fill any of them (all in one pool, plain only, or a split), so every single fixed
# EAGLE-3 configuration the baselines run is a fleet it can reach.
def planned_scenario(base: Scenario) -> Scenario:
    """`base`'s pools plus empty EAGLE-3 pools at every other k its EAGLE-3 may run."""
    have = {s.name for s in base.fleet}
    top = max((s.max_k for s in base.fleet if s.method == "eagle3"), default=8)
    template = next(s for s in base.fleet if s.method == "eagle3")
    extra = tuple(replace(template, name=f"eagle3-k{k}", k=k, workers=0, max_k=top,
                          group=f"eagle3-k{k}")
                  for k in (1, 2, 3, 4, 6, 8, 12) if k <= top and f"eagle3-k{k}" not in have)
    return Scenario(f"{base.name}-planned", base.fleet + extra, base.curves, base.rules,
                    base.chain_method, relaunch_s=base.relaunch_s, law=base.law,
                    notes=f"{base.name} fixed-k pools, workers moved between them by the "
                          "fleet planner (starts as the static split; one relaunch at a time)")


def measured_scenario(base: Scenario, world: World, seed: int, base_step_s: float = 0.015,
                      model: str = "base"
                      ) -> tuple[Scenario, tuple[Benchmarked, ...], dict[str, WorkerPrior]]:
    """The launch benchmark of `base`'s engine (bench/sim/launch.py), a pool per candidate
    configuration (policies/planner/launch.py `candidate_configs`), all workers at first
    in the configuration best over an even mix at the benchmark's middle batch (the plan
    before traffic then splits them), and the pools' priors from the benchmark."""
    bench = tuple(launch_bench(base, world, seed, base_step_s))
    classes = list(even_mix())
    configs = candidate_configs(list(bench), classes, BENCH_BATCHES)
    by_config = {(b.method, b.k): b for b in bench}
    middle = BENCH_BATCHES[len(BENCH_BATCHES) // 2]
    first = max(configs, key=lambda c: sum(by_config[c].tokens_per_s(cls, middle)
                                           for cls in classes))
    specs = {s.method: s for s in base.fleet}
    fleet = []
    for method, k in configs:
        spec = specs.get(method, base.fleet[0])
        name = "plain" if method == "plain" else f"{method}-k{k}"
        fleet.append(SimPool(name, spec.engine, method, k, False,
                             FLEET_WORKERS if (method, k) == first else 0, max(k, 0),
                             base.curves.get(method, spec.curve), group=name, law=base.law))
    scenario = Scenario(f"{base.name}-measured", tuple(fleet), base.curves, base.rules,
                        base.chain_method, relaunch_s=base.relaunch_s, law=base.law,
                        notes=f"{base.name}: a pool per configuration the launch benchmark "
                              "measured best for some class or the mix, planned from it")
    priors = pool_priors(list(bench), [(p.name, p.method, p.k) for p in fleet], model,
                         base_step_s)
    return scenario, bench, priors


PLANNED = planned_scenario(SGLANG_POOLS)
PLANNED_FLEET = PLANNED.fleet
# the server start a planner move pays after its simulated drain (bench/sim/relaunch.py):
# SGLang's start-up; a vLLM CPU server's eager start (its 93 s relaunch includes the drain)
START_S = {"sglang": relaunch.read("sglang"), "vllm": relaunch.read("vllm-eager-start")}


@dataclass
class Move:
    worker: Worker
    src: str
    dst: str
    ready_at: float


@dataclass
class MovableFleet(Fleet):
    """A `Fleet` whose workers change pool: a moving worker is in no pool's list (takes
    no new requests) but still finishes what it runs, then joins its new pool."""

    moving: Move | None = None
    done_moves: list = field(default_factory=list)  # (time, src, dst)

    def views(self) -> list[PoolView]:
        return [PoolView(s.name, s.engine, s.method, self.k[s.name], s.per_request_k,
                         len(self.workers[s.name]),
                         sum(w.batch for w in self.workers[s.name]), s.max_k)
                for s in self.specs]

    def least_worker(self, pool: str) -> tuple[int, Worker]:
        workers = self.workers[pool]
        i = min(range(len(workers)), key=lambda j: workers[j].batch)
        return i, workers[i]

    def counts(self) -> dict[str, int]:
        """Workers per pool, the one moving counted where it is going."""
        out = {s.name: len(self.workers[s.name]) for s in self.specs}
        if self.moving is not None:
            out[self.moving.dst] += 1
        return out

    def start_move(self, src: str, dst: str, now: float, relaunch_s: float) -> None:
        workers = self.workers[src]
        worker = min(workers, key=lambda w: w.batch)  # the quickest to drain
        workers.remove(worker)
        worker.advance(now)
        drain = max(((r.finish_v - worker.v) * worker.step_s for r in worker.running),
                    default=0.0)
        self.moving = Move(worker, src, dst, now + max(drain, 0.0) + relaunch_s)

    def advance(self, now: float) -> None:
        super().advance(now)
        move = self.moving
        if move is not None and now >= move.ready_at:
            move.worker.advance(now)
            self.workers[move.dst].append(move.worker)
            self.done_moves.append((move.ready_at, move.src, move.dst))
            self.moving = None


@dataclass
class Planned(Learned):
    """The learned policy routes; the planner moves workers (one at a time)."""

    planner: PlannerConfig = field(default_factory=PlannerConfig)
    plan_interval_s: float = 10.0
    launch_at_plan: bool = False  # start in the planner's cold plan, not the static split
    moves: bool = True  # False: the fleet stays as launched (what relaunches are worth)
    # the launch benchmark: the planner's speed (`measured_speed`); None: the state's
    bench: tuple[Benchmarked, ...] | None = None
    plans: list = field(default_factory=list)  # (time, FleetPlan) when the desire changed
    _fleet: MovableFleet | None = None
    _desired: dict | None = None
    _last: FleetPlan | None = None
    _next_plan: float = 0.0

    def make_fleet(self, base_step_s: float, world: World) -> MovableFleet:
        """The configured split; with `launch_at_plan`, the split the planner wants before
        any traffic (the workers' priors, an even class mix), launched so: no relaunch."""
        specs = self.fleet
        if self.launch_at_plan:
            self.policy.refit()  # the workers' priors into the state
            cold = self.desired_fleet({s.name: s.workers for s in specs},
                                      replace(self.planner, relaunch_s=0.0))
            specs = tuple(replace(s, workers=cold.desired[s.name]) for s in specs)
            self.plans.append((0.0, cold))
        self._fleet = MovableFleet(specs, base_step_s, world.co_batching,
                                   measured_steps=world.measured_steps)
        return self._fleet

    def tick(self, now: float, pools: dict[str, PoolView]) -> Relaunches:
        super().tick(now, pools)  # refits; relaunch=False: pools keep their k
        fleet = self._fleet
        if fleet is None or now < self._next_plan:
            return {}
        self._next_plan = now + self.plan_interval_s
        current = fleet.counts()
        desired = settle(self.desired_fleet(current), self._last, now,
                         self.planner.dwell_s if self.planner.dwell_s is not None
                         else self.relaunch_s)
        self._last = desired
        if desired.desired != self._desired:
            self._desired = desired.desired
            self.plans.append((now, desired))
        if self.moves and fleet.moving is None and self._desired is not None:
            serving = {s.name: len(fleet.workers[s.name]) for s in self.fleet}
            move = next_move(serving, self._desired)
            if move is not None:
                fleet.start_move(*move, now, self.relaunch_s)
        return {}

    def desired_fleet(self, current: dict[str, int], config: PlannerConfig | None = None
                      ) -> FleetPlan:
        slots = {s.name: PoolSlot(s.name, s.method, 0 if s.method == "plain" else s.k)
                 for s in self.fleet}
        demand = demand_from_snapshot(self.store.snapshot(), self.model, self.tau_s)
        speed = (measured_speed(self.bench, self.policy.state, self.model)
                 if self.bench is not None
                 else state_speed(self.policy.state, self.model, slots))
        return plan(self.model, current, slots, demand, speed, config or self.planner,
                    self._desired, self.policy.state.measured_k)


def planned_router(name: str, scenario: Scenario, policy_config, priors: dict, slo_s: float,
                   relaunch_s: float = SGLANG_RELAUNCH_S, launch_at_plan: bool = False,
                   moves: bool = True, bench: tuple[Benchmarked, ...] | None = None
                   ) -> Planned:
    # measured: no k trust region (nothing is extrapolated in k)
    trust = None if bench is not None else PlannerConfig().k_trust_margin
    return Planned(name, scenario.fleet, policy_config, relaunch=False,
                   relaunch_s=relaunch_s, worker_priors=priors,
                   planner=PlannerConfig(relaunch_s=relaunch_s, slo_s_per_token=slo_s,
                                         k_trust_margin=trust),
                   launch_at_plan=launch_at_plan, moves=moves, bench=bench)


# the planner rows: name -> (launched at the cold plan, moves workers, from the benchmark)
PLANNER_ROWS = {"planner": (False, True, False), "planner-launched": (True, True, False),
                "planner-launched-frozen": (True, False, False),
                "planner-measured": (True, True, True),
                "planner-measured-frozen": (True, False, True)}



@dataclass(frozen=True, slots=True)
class FleetComparison:
    """Per phase and overall: the planner's fleet against each baseline."""

    results: dict  # router name -> PolicyResult
    best_fixed: str
    moves: dict  # planner row -> [(time, src, dst)]
    plans: dict  # planner row -> [(time, FleetPlan)]
    phases: tuple[str, ...]
    phase_starts: tuple[float, ...]  # first arrival of each phase (s)

    def phase_of(self, t: float) -> int:
        return max((i for i, start in enumerate(self.phase_starts) if t >= start), default=0)

    def ratio(self, baseline: str, ours_name: str = "planner"
              ) -> tuple[float, tuple[float, ...]]:
        ours, other = self.results[ours_name], self.results[baseline]
        return (ours.mean_tokens_per_s / other.mean_tokens_per_s,
                tuple(a / b if b > 0 else 0.0 for a, b in
                      zip(ours.phase_tokens_per_s, other.phase_tokens_per_s, strict=True)))


def compare(config, policy_config, fixed_ks: tuple[int, ...],
            relaunch_s: float = SGLANG_RELAUNCH_S, base: Scenario = SGLANG_POOLS
            ) -> FleetComparison:
    """The planner's fleet, the static split (learned routing, per-pool k relaunches),
    the launched fleet (the shipped `adaptive`), SGLang's adaptive EAGLE pool and every
    single fixed configuration, on one workload; `base` the engine's fleet."""
    from bench.sim.evaluation import engine_baselines, routers, summarize, worker_priors
    from bench.sim.simulator import simulate, workload

    requests = workload(config)
    n = len(config.phases)
    made = routers(config, policy_config, fixed_ks, base)
    wanted = {"static-split": made["adaptive-split"], "launched": made["adaptive"],
              **{name: f for name, f in made.items() if name.startswith("fixed:")}}
    results = {}
    for name, factory in wanted.items():
        router = factory()
        router.name = name
        results[name] = summarize(name, simulate(router, config, requests), n)
    adaptive = engine_baselines(config, base)["sglang-adaptive"]
    results["sglang-adaptive"] = summarize("sglang-adaptive", adaptive(requests), n)
    planned = planned_scenario(base)
    priors = worker_priors(planned, config.world, config.model, config.seed)
    measured, bench, bench_priors = measured_scenario(base, config.world, config.seed,
                                                      config.base_step_s, config.model)
    moves, plans = {}, {}
    for name, (launched, moving, from_bench) in PLANNER_ROWS.items():
        planner = (planned_router(name, measured, policy_config, bench_priors,
                                  config.slo_itl_s, relaunch_s, launched, moving, bench)
                   if from_bench else
                   planned_router(name, planned, policy_config, priors, config.slo_itl_s,
                                  relaunch_s, launched, moving))
        results[name] = summarize(name, simulate(planner, config, requests), n)
        assert planner._fleet is not None
        moves[name], plans[name] = planner._fleet.done_moves, planner.plans
    fixed = [r for name, r in results.items() if name.startswith("fixed:")]
    best = max(fixed, key=lambda r: r.mean_tokens_per_s).name
    starts = tuple(min(r.arrival_s for r in requests if r.phase == i) for i in range(n))
    return FleetComparison(results, best, moves, plans, tuple(p.name for p in config.phases),
                           starts)
