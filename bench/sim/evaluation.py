"""Runs every router through the simulator and reduces the outcomes to the headline ratios.

Metrics per router: mean per-request tokens/s (output tokens / end-to-end seconds), p50
and p99 end-to-end latency, SLO attainment, and mean tokens/s per phase. Ratios:
adaptive vs oracle and vs the best fixed (method, k) over the whole run, adaptive vs
plain in the saturation phase, and per drift the requests until a 100-request rolling
mean of adaptive tokens/s comes within 5% of the oracle's on the same requests. Each run
is one fleet scenario (policies/scenarios.py); every router sees the same arrivals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.sim.baselines import (
    BatchSizeTable,
    Learned,
    Oracle,
    PerServerEMA,
    SimPool,
    SimRouter,
    StaticRules,
)
from bench.sim.calibration import COLUMNS, METHODS, PAPER_K, draft_cost
from bench.sim.scenarios import SCENARIOS, Scenario
from bench.sim.simulator import (
    TRAINED_DRAFTERS,
    Outcome,
    SimConfig,
    simulate,
    uniform_step_s,
    workload,
)
from bench.sim.world import World
from policies.acceptance import TEMPERATURE_BUCKETS, invert_accept_length
from policies.decision import PolicyConfig
from policies.prior import Measured, MeasuredCost, WorkerPrior, keyed, measured_step_curve

FIXED_KS = (1, 2, 3, 4, 6, 8)
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
            return i
    return None


BENCH_BATCHES = (1, 2, 4, 8, 16, 32, 64)
BENCH_KS = (1, 2, 4)


def _batch_bench(spec: SimPool, world: World, base_step_s: float = 0.015) -> Measured:
    """What the worker's batch benchmark would write: the step time of `b` requests all at
    k, for plain and the pool's method (the world's costs; no per-prompt acceptance in it,
    a step's cost does not depend on what gets accepted)."""
    costs = [MeasuredCost("plain", 0, b, uniform_step_s(base_step_s, spec.curve, b, 0, 0.0), 64)
             for b in BENCH_BATCHES]
    for k in sorted({*BENCH_KS, spec.k}):
        draft = draft_cost(spec.method) * world.depth(spec.method, k)
        costs += [MeasuredCost(spec.method, k, b,
                               uniform_step_s(base_step_s, spec.curve, b, k, draft), 64)
                  for b in BENCH_BATCHES]
    return Measured("sim", "simulated batch bench", "", "simulated", (), tuple(costs))


def worker_priors(scenario: Scenario, world: World, model: str) -> dict[str, WorkerPrior]:
    """What each pool's workers would publish about themselves before any traffic (the
    gateway reads it at startup): embedded workers their engine benchmark, acceptance per
    (task, temperature bucket) at the pool's k plus the relative draft cost; SGLang and
    vLLM servers only their average accept length (one figure for every class, the mix
    of the classes alike). Measured on the base target: the fine-tuned phase's drop is
    for telemetry to find."""
    out = {}
    for spec in scenario.fleet:
        if spec.method == "plain" or spec.k <= 0:
            continue
        lengths = {(t, b): world.expected_accept_length(spec.method, t, b, spec.k)
                   for t in COLUMNS for b in TEMPERATURE_BUCKETS}  # the world's classes
        if spec.engine == "embedded":
            per_class: dict[tuple[str, str], float] = {
                key: invert_accept_length(e, spec.k) for key, e in lengths.items()}
            out[spec.name] = WorkerPrior(keyed(model, spec.method, per_class),
                                         draft_cost(spec.method), "simulated engine bench",
                                         measured_step_curve(_batch_bench(spec, world),
                                                             spec.method))
        else:
            out[spec.name] = WorkerPrior.from_server_average(
                model, spec.method, float(np.mean(list(lengths.values()))), spec.k)
    return out


def routers(config: SimConfig, policy_config: PolicyConfig | None = None,
            fixed_ks: tuple[int, ...] = FIXED_KS, scenario: Scenario = SCENARIOS["sglang-pools"]
            ) -> dict[str, Callable[[], SimRouter]]:
    """Factories (fresh state per run) for every router the report compares."""
    fleet, homogeneous = scenario.fleet, scenario.homogeneous
    factories: dict[str, Callable[[], SimRouter]] = {
        "plain": lambda: SimRouter("plain", homogeneous("plain", 0)),
    }
    for method in METHODS:
        if method not in scenario.methods:
            continue
        for k in fixed_ks:
            if k <= PAPER_K[method] or method == "ngram":
                factories[f"fixed:{method}:k{k}"] = (
                    lambda m=method, kk=k: SimRouter(  # type: ignore[misc]
                        f"fixed:{m}:k{kk}", homogeneous(m, kk)))
    factories["rules"] = lambda: StaticRules("rules", fleet, scenario.rules)
    chain = scenario.chain_method
    factories["sglang-ema"] = lambda: PerServerEMA("sglang-ema", homogeneous(chain, 3))
    factories["vllm-table"] = lambda: BatchSizeTable("vllm-table", homogeneous(chain, 3))
    policy_config = policy_config or PolicyConfig(seed=config.seed)
    priors = worker_priors(scenario, config.world, config.model)
    factories["adaptive"] = lambda: Learned(
        "adaptive", fleet, policy_config, relaunch_s=scenario.relaunch_s,
        relaunch_interval_s=scenario.relaunch_interval_s, worker_priors=priors)
    factories["adaptive-flat-prior"] = lambda: Learned(
        "adaptive-flat-prior", fleet, policy_config,
        relaunch_s=scenario.relaunch_s, relaunch_interval_s=scenario.relaunch_interval_s)
    if scenario.fixed_k:
        factories["adaptive-no-relaunch"] = lambda: Learned(
            "adaptive-no-relaunch", fleet, policy_config, relaunch=False,
            worker_priors=priors)
    scales = tuple(p.drafter_scale for p in config.phases)
    factories["oracle"] = lambda: Oracle("oracle", fleet, None, config.base_step_s, scales,
                                         TRAINED_DRAFTERS)
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
    results = {name: summarize(name, out, n_phases) for name, out in outcomes.items()}
    fixed = {n: r for n, r in results.items() if n.startswith("fixed:")}
    best_fixed = max(fixed.values(), key=lambda r: r.mean_tokens_per_s)
    ours, oracle, plain = results["adaptive"], results["oracle"], results["plain"]
    saturation = next(i for i, p in enumerate(config.phases) if p.name == "saturation")
    bounds = np.cumsum([0] + [p.requests for p in config.phases])
    recover = [requests_to_recover(outcomes["adaptive"], outcomes["oracle"], int(bounds[i]),
                                   int(bounds[i + 1])) for i in range(1, n_phases)]
    summary = {
        "adaptive_vs_oracle": ours.mean_tokens_per_s / oracle.mean_tokens_per_s,
        "adaptive_vs_best_fixed": ours.mean_tokens_per_s / best_fixed.mean_tokens_per_s,
        "best_fixed": best_fixed.name,
        "oracle_vs_best_fixed": oracle.mean_tokens_per_s / best_fixed.mean_tokens_per_s,
        "adaptive_vs_plain_at_saturation": (ours.phase_tokens_per_s[saturation]
                                            / plain.phase_tokens_per_s[saturation]),
        "requests_to_recover_after_drift": int(max(
            (r if r is not None else bounds[-1] for r in recover), default=0)),
        "recovery_per_drift": {config.phases[i + 1].name: r for i, r in enumerate(recover)},
        "adaptive_vs_sglang_ema": ours.mean_tokens_per_s / results["sglang-ema"].mean_tokens_per_s,
        "adaptive_vs_vllm_table": ours.mean_tokens_per_s / results["vllm-table"].mean_tokens_per_s,
        "adaptive_vs_rules": ours.mean_tokens_per_s / results["rules"].mean_tokens_per_s,
        "flat_prior_vs_oracle": (results["adaptive-flat-prior"].mean_tokens_per_s
                                 / oracle.mean_tokens_per_s),
        "flat_prior_vs_best_fixed": (results["adaptive-flat-prior"].mean_tokens_per_s
                                     / best_fixed.mean_tokens_per_s),
        "flat_prior_vs_sglang_ema": (results["adaptive-flat-prior"].mean_tokens_per_s
                                     / results["sglang-ema"].mean_tokens_per_s),
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

