"""Runs every router through the simulator and reduces the outcomes to the headline ratios.

Metrics per router: mean per-request tokens/s (output tokens / end-to-end seconds), p50
and p99 end-to-end latency, SLO attainment, and mean tokens/s per phase. Ratios, each
`[overall, phase 1, ...]`: the shipped strategy (`adaptive`) against the best homogeneous
fleet (every (method, k) on all workers), SGLang's own adaptive speculation on a
homogeneous fleet (bench/sim/engine_fleet.py), the per-class oracle and the static split
(the scenario's pools routed by the operator's rules); per drift, the requests after it
until a 100-request rolling mean of adaptive tokens/s is within 5% of the oracle's on the
same requests (0: at once; None: never). Each run is one fleet scenario
(bench/sim/scenarios.py); every router sees the same arrivals. The workers' prior comes
from a measurement run in the world (bench/sim/measure.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from bench.sim.baselines import Learned, Oracle, first_pool, static_rules
from bench.sim.calibration import METHODS, PAPER_K, PAPER_TREE_DEPTH
from bench.sim.engine_fleet import BatchSchedule, SGLangAdaptive, simulate_engine
from bench.sim.launch import launched
from bench.sim.measure import measured_priors
from bench.sim.scenarios import FLEET_WORKERS, SCENARIOS, Scenario
from bench.sim.sharding import Sharder
from bench.sim.simulator import TRAINED_DRAFTERS, Outcome, SimConfig, SimRouter, simulate, workload
from bench.sim.steplaw import law
from bench.sim.types import SimPool, SimRequest
from bench.sim.world import World
from policies.decision import PolicyConfig
from policies.prior import WorkerPrior

FIXED_KS = (1, 2, 3, 4, 6, 8, 12)  # capped per method by the k its pools may run
RECOVERY_WINDOW = 100


@dataclass(frozen=True, slots=True)
class PolicyResult:
    name: str
    mean_tokens_per_s: float
    p50_latency_s: float
    p99_latency_s: float
    slo_attainment: float
    phase_tokens_per_s: tuple[float, ...]
    explored_fraction: float


@dataclass
class Evaluation:
    results: dict[str, PolicyResult]
    summary: dict[str, object]
    scenario: Scenario = SCENARIOS["sglang-pools"]
    outcomes: dict[str, list[Outcome]] = field(repr=False, default_factory=dict)


def summarize(name: str, outcomes: list[Outcome], phases: int) -> PolicyResult:
    tps = np.array([o.tokens_per_s for o in outcomes])
    e2e = np.array([o.e2e_s for o in outcomes])
    phase = np.array([o.phase for o in outcomes])
    return PolicyResult(
        name, float(tps.mean()), float(np.percentile(e2e, 50)), float(np.percentile(e2e, 99)),
        float(np.mean([o.slo_met for o in outcomes])),
        tuple(float(tps[phase == p].mean()) if np.any(phase == p) else 0.0
              for p in range(phases)),
        float(np.mean([o.explored for o in outcomes])))


def requests_to_recover(ours: list[Outcome], oracle: list[Outcome], start: int, end: int,
                        within: float = 0.05) -> int | None:
    """Requests after `start` until the rolling mean is within `within` of the oracle's."""
    mine = np.array([o.tokens_per_s for o in ours[start:end]])
    best = np.array([o.tokens_per_s for o in oracle[start:end]])
    for i in range(RECOVERY_WINDOW, len(mine) + 1):
        window = slice(i - RECOVERY_WINDOW, i)
        if mine[window].mean() >= (1.0 - within) * best[window].mean():
            return i - RECOVERY_WINDOW  # 0: the first window after the drift already is
    return None


def ratios(ours: PolicyResult, other: PolicyResult) -> list[float]:
    """[overall, phase 1, ...] tokens/s of `ours` over `other`."""
    return [ours.mean_tokens_per_s / other.mean_tokens_per_s,
            *(a / b if b > 0 else 0.0
              for a, b in zip(ours.phase_tokens_per_s, other.phase_tokens_per_s, strict=True))]


# every strategy for fixed-k fleets the report measures (docs/POLICY.md); `adaptive` ships
STRATEGIES = ("adaptive", "adaptive-no-relaunch", "adaptive-split", "shard-adaptive")


def worker_priors(scenario: Scenario, world: World, model: str, seed: int = 0
                  ) -> dict[str, WorkerPrior]:
    """What each pool's workers publish after measuring themselves in the world (a sample
    held apart from the traffic; bench/sim/measure.py), never the world's expected values."""
    return measured_priors(scenario, world, model, seed)


EngineRun = Callable[[list[SimRequest]], list[Outcome]]
SGLANG_INITIAL_STEPS = 3  # --speculative-num-steps of the adaptive fleet's servers


def engine_baselines(config: SimConfig, scenario: Scenario) -> dict[str, EngineRun]:
    """Homogeneous fleets whose engines choose k per verify batch (step-level simulation,
    bench/sim/engine_fleet.py), with the scenario's chain drafter (EAGLE topk 1: what
    SGLang's adaptive mode supports): SGLang's adaptive speculation, vLLM's batch-size
    schedule, and strategy (a), the same SGLang fleet behind speculation-aware sharding."""
    chain, step_law = scenario.chain_method, law(scenario.law)

    def sglang(requests: list[SimRequest]) -> list[Outcome]:
        return simulate_engine(requests, config, chain,
                               lambda: SGLangAdaptive(SGLANG_INITIAL_STEPS), step_law)

    def vllm(requests: list[SimRequest]) -> list[Outcome]:
        return simulate_engine(requests, config, chain, BatchSchedule, step_law)

    def sharded(requests: list[SimRequest]) -> list[Outcome]:
        sharder = Sharder(FLEET_WORKERS)
        return simulate_engine(requests, config, chain,
                               lambda: SGLangAdaptive(SGLANG_INITIAL_STEPS), step_law,
                               dispatch=sharder.dispatch, finished=sharder.finished)

    return {"sglang-adaptive": sglang, "vllm-table": vllm, "shard-adaptive": sharded}


def ceiling_fleet(scenario: Scenario) -> tuple[SimPool, ...]:
    """Every method of the fleet on every worker, k per request up to its pools' max_k."""
    out = []
    for method in dict.fromkeys(s.method for s in scenario.fleet):
        specs = [s for s in scenario.fleet if s.method == method]
        out.append(replace(specs[0], name=method, per_request_k=True, workers=FLEET_WORKERS,
                           max_k=max(s.max_k for s in specs), group="ceiling"))
    return tuple(out)


def routers(config: SimConfig, policy_config: PolicyConfig | None = None,
            fixed_ks: tuple[int, ...] = FIXED_KS, scenario: Scenario = SCENARIOS["sglang-pools"]
            ) -> dict[str, Callable[[], SimRouter]]:
    """Factories (fresh state per run) for every router the report compares."""
    fleet, homogeneous = scenario.fleet, scenario.homogeneous
    factories: dict[str, Callable[[], SimRouter]] = {
        "plain": lambda: first_pool("plain", homogeneous("plain", 0)),
    }
    for method in METHODS:
        if method not in scenario.methods:
            continue
        # every k the policy may choose for the method (its pools' max_k; a tree drafter
        # no deeper than its tree, past which k only adds nodes)
        top = max(s.max_k for s in fleet if s.method == method)
        for k in fixed_ks:
            if k <= top and (method not in PAPER_TREE_DEPTH or k <= PAPER_K[method]):
                factories[f"fixed:{method}:k{k}"] = (
                    lambda m=method, kk=k: first_pool(  # type: ignore[misc]
                        f"fixed:{m}:k{kk}", homogeneous(m, kk)))
    factories["rules"] = lambda: static_rules("rules", fleet, scenario.rules)
    policy_config = policy_config or PolicyConfig(seed=config.seed)
    if scenario.fixed_k:  # the operator sets the real restart time (docs/POLICY.md)
        policy_config = replace(policy_config, relaunch_cost_s=scenario.relaunch_s)
    priors = worker_priors(scenario, config.world, config.model, config.seed)
    # the shipped strategy: on a fixed-k fleet, launch the pools the benchmark of every
    # (method, k) says (bench/sim/launch.py), then route and relaunch as learned; the
    # configured split routed by the same policy is `adaptive-split`
    served, served_priors = fleet, priors
    if scenario.fixed_k:
        launch, _, served_priors = launched(scenario, config.world, config.seed,
                                            base_step_s=config.base_step_s,
                                            model=config.model)
        served = launch.fleet
        factories["adaptive-split"] = lambda: Learned(
            "adaptive-split", fleet, policy_config, relaunch_s=scenario.relaunch_s,
            relaunch_interval_s=scenario.relaunch_interval_s, worker_priors=priors)
    factories["adaptive"] = lambda: Learned(
        "adaptive", served, policy_config, relaunch_s=scenario.relaunch_s,
        relaunch_interval_s=scenario.relaunch_interval_s, worker_priors=served_priors)
    if scenario.fixed_k:
        factories["adaptive-no-relaunch"] = lambda: Learned(
            "adaptive-no-relaunch", served, policy_config, relaunch=False,
            worker_priors=served_priors)
    scales = tuple(p.drafter_scale for p in config.phases)
    # the per-class oracle over every pool x k the policy may choose (a fixed-k pool at any
    # k up to its max_k, as if relaunched for free: an upper bound), and the same oracle
    # held to the pools' launch k
    factories["oracle"] = lambda: Oracle("oracle", fleet, None, config.base_step_s, scales,
                                         TRAINED_DRAFTERS, any_k=True)
    if scenario.fixed_k:
        factories["oracle-launch-k"] = lambda: Oracle(
            "oracle-launch-k", fleet, None, config.base_step_s, scales, TRAINED_DRAFTERS)
    # the ceiling of any routing, sharding or planning on this engine: the same oracle on
    # all 12 workers each able to run every method of the fleet at any k per request
    # (no engine can: not deployable)
    if scenario.fixed_k:  # (a per-request-k fleet's oracle is its ceiling already)
        factories["ceiling"] = lambda: Oracle("ceiling", ceiling_fleet(scenario), None,
                                              config.base_step_s, scales, TRAINED_DRAFTERS)
    return factories


def evaluate(config: SimConfig, policy_config: PolicyConfig | None = None,
             fixed_ks: tuple[int, ...] = FIXED_KS,
             scenario: Scenario = SCENARIOS["sglang-pools"]) -> Evaluation:
    requests = workload(config)
    n_phases = len(config.phases)
    outcomes, relaunches = {}, 0
    for name, make in routers(config, policy_config, fixed_ks, scenario).items():
        router = make()
        outcomes[name] = simulate(router, config, requests)
        if name == "adaptive" and isinstance(router, Learned):
            relaunches = len(router.relaunches)
    for name, run in engine_baselines(config, scenario).items():
        if name == "shard-adaptive" and not scenario.fixed_k:
            continue  # a strategy for fixed-k fleets
        outcomes[name] = run(requests)
    results = {name: summarize(name, out, n_phases) for name, out in outcomes.items()}
    fixed = {n: r for n, r in results.items() if n.startswith("fixed:")}
    best_fixed = max(fixed.values(), key=lambda r: r.mean_tokens_per_s)
    ours, oracle, plain = results["adaptive"], results["oracle"], results["plain"]
    saturation = next(i for i, p in enumerate(config.phases) if p.name == "saturation")
    bounds = np.cumsum([0] + [p.requests for p in config.phases])
    recover = [requests_to_recover(outcomes["adaptive"], outcomes["oracle"], int(bounds[i]),
                                   int(bounds[i + 1])) for i in range(1, n_phases)]
    top = sorted(fixed.values(), key=lambda r: -r.mean_tokens_per_s)[:3]
    never = any(r is None for r in recover)
    summary = {
        "vs_best_homogeneous": ratios(ours, best_fixed),
        "vs_sglang_adaptive_homogeneous": ratios(ours, results["sglang-adaptive"]),
        "vs_oracle": ratios(ours, oracle),
        "vs_static_split": ratios(ours, results["rules"]),
        "vs_oracle_launch_k": (ratios(ours, results["oracle-launch-k"])
                               if "oracle-launch-k" in results else None),
        "oracle_vs_best_homogeneous": ratios(oracle, best_fixed),
        "ceiling_vs_best_homogeneous": ratios(results.get("ceiling", oracle), best_fixed),
        "vs_ceiling": ratios(ours, results.get("ceiling", oracle)),
        "launched_fleet": (launched(scenario, config.world, config.seed,
                                    base_step_s=config.base_step_s,
                                    model=config.model)[1].describe()
                           if scenario.fixed_k else None),
        "recovery_requests": None if never else max(recover, default=0),
        "best_homogeneous": [r.name for r in top],
        "strategies": {name: {"vs_best_homogeneous": ratios(results[name], best_fixed),
                              "vs_sglang_adaptive_homogeneous": ratios(
                                  results[name], results["sglang-adaptive"])}
                       for name in STRATEGIES if name in results},
        "adaptive_vs_oracle": ours.mean_tokens_per_s / oracle.mean_tokens_per_s,
        "adaptive_vs_best_fixed": ours.mean_tokens_per_s / best_fixed.mean_tokens_per_s,
        "best_fixed": best_fixed.name,
        "oracle_vs_best_fixed": oracle.mean_tokens_per_s / best_fixed.mean_tokens_per_s,
        "adaptive_vs_plain_at_saturation": (ours.phase_tokens_per_s[saturation]
                                            / plain.phase_tokens_per_s[saturation]),
        "requests_to_recover_after_drift": int(max(
            (r if r is not None else bounds[-1] for r in recover), default=0)),
        "recovery_per_drift": {config.phases[i + 1].name: r for i, r in enumerate(recover)},
        "adaptive_vs_sglang_ema": (ours.mean_tokens_per_s
                                   / results["sglang-adaptive"].mean_tokens_per_s),
        "adaptive_vs_vllm_table": ours.mean_tokens_per_s / results["vllm-table"].mean_tokens_per_s,
        "adaptive_vs_rules": ours.mean_tokens_per_s / results["rules"].mean_tokens_per_s,
        "adaptive_explored_fraction": ours.explored_fraction,
        "adaptive_relaunches": relaunches,
        "requests": int(bounds[-1]),
        "seed": config.seed,
        "scenario": scenario.name,
        "deployable": scenario.deployable,
    }
    if "adaptive-no-relaunch" in results:
        summary["adaptive_no_relaunch_vs_best_fixed"] = (
            results["adaptive-no-relaunch"].mean_tokens_per_s / best_fixed.mean_tokens_per_s)
    return Evaluation(results, summary, scenario, outcomes)

