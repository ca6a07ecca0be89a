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

from bench.sim.baselines import EditRule, Learned, Oracle, edit_rule, first_pool, static_rules
from bench.sim.calibration import METHODS, PAPER_K, PAPER_TREE_DEPTH
from bench.sim.engine_fleet import (
    AdaptiveVerification,
    BatchSchedule,
    SGLangAdaptive,
    simulate_engine,
)
from bench.sim.launch import (
    Mix,
    benchmark,
    launched,
    observed_mix,
    table_method,
    tuned_schedule,
    tuned_tiers,
    verification_k,
)
from bench.sim.measure import measured_priors
from bench.sim.router import Routed
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
STRATEGIES = ("adaptive", "adaptive-no-relaunch", "adaptive-observed-mix", "adaptive-split",
              "shard-adaptive")


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
    SGLang's adaptive mode supports): SGLang's adaptive speculation at its default tiers
    and with candidates tuned from the launch benchmark (bench/sim/launch.py
    `tuned_tiers`), vLLM's batch-size schedule (an operator's and one read off the same
    benchmark, `tuned_schedule`, for the method the benchmark favours, `table_method`),
    vLLM's adaptive verification at the k the benchmark
    favours (`verification_k`), and strategy (a), the same SGLang fleet behind
    speculation-aware sharding. Each runs under the scenario's engine law: vLLM's
    designs on the SGLang fleet are those designs in SGLang's world, not SGLang's."""
    chain, step_law = scenario.chain_method, law(scenario.law)

    def bench() -> list:
        return benchmark(scenario, config.world, config.seed, config.base_step_s)

    def sglang(requests: list[SimRequest]) -> list[Outcome]:
        return simulate_engine(requests, config, chain,
                               lambda: SGLangAdaptive(SGLANG_INITIAL_STEPS), step_law)

    def vllm(requests: list[SimRequest]) -> list[Outcome]:
        return simulate_engine(requests, config, chain, BatchSchedule, step_law)

    def tuned(requests: list[SimRequest]) -> list[Outcome]:
        tiers = tuned_tiers(bench(), chain)
        return simulate_engine(requests, config, chain,
                               lambda: SGLangAdaptive(SGLANG_INITIAL_STEPS, tiers), step_law)

    def table_tuned(requests: list[SimRequest]) -> list[Outcome]:
        method = table_method(bench())
        schedule = tuned_schedule(bench(), method)
        return simulate_engine(requests, config, method, lambda: BatchSchedule(schedule),
                               step_law)

    def verification(requests: list[SimRequest]) -> list[Outcome]:
        k = verification_k(bench(), chain)
        return simulate_engine(requests, config, chain, lambda: AdaptiveVerification(k),
                               step_law)

    def sharded(requests: list[SimRequest]) -> list[Outcome]:
        sharder = Sharder(FLEET_WORKERS)
        return simulate_engine(requests, config, chain,
                               lambda: SGLangAdaptive(SGLANG_INITIAL_STEPS), step_law,
                               dispatch=sharder.dispatch, finished=sharder.finished)

    return {"sglang-adaptive": sglang, "sglang-adaptive-tuned": tuned, "vllm-table": vllm,
            "vllm-table-tuned": table_tuned, "vllm-adaptive-verification": verification,
            "shard-adaptive": sharded}


def ceiling_fleet(scenario: Scenario) -> tuple[SimPool, ...]:
    """Every method of the fleet on every worker, k per request up to its pools' max_k."""
    out = []
    for method in dict.fromkeys(s.method for s in scenario.fleet):
        specs = [s for s in scenario.fleet if s.method == method]
        out.append(replace(specs[0], name=method, per_request_k=True, workers=FLEET_WORKERS,
                           max_k=max(s.max_k for s in specs), group="ceiling"))
    return tuple(out)


@dataclass(frozen=True)
class Served:
    """The fleet a strategy serves on and its workers' prior: on a fixed-k scenario the
    pools launched from the benchmark for a class mix (bench/sim/launch.py), else the
    scenario's own fleet."""

    scenario: Scenario
    priors: dict[str, WorkerPrior]
    describe: str | None  # the launch plan; None: not launched (per-request k)


def served(scenario: Scenario, config: SimConfig, mix: Mix | None) -> Served:
    if not scenario.fixed_k:
        return Served(scenario, worker_priors(scenario, config.world, config.model,
                                              config.seed), None)
    launch, plan, priors = launched(scenario, config.world, config.seed,
                                    base_step_s=config.base_step_s, model=config.model, mix=mix)
    return Served(launch, priors, plan.describe())


def routers(config: SimConfig, policy_config: PolicyConfig | None = None,
            fixed_ks: tuple[int, ...] = FIXED_KS, scenario: Scenario = SCENARIOS["sglang-pools"],
            mix: Mix | None = None, lean: bool = False) -> dict[str, Callable[[], SimRouter]]:
    """Factories (fresh state per run) for every router the report compares; `mix`: the
    observed class mix `adaptive-observed-mix` launches from; `lean`: only plain, the
    fixed fleets, the operator's table, the shipped strategy and its observed-mix twin."""
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

    def learned(name: str, on: Served, relaunch: bool = True) -> Callable[[], SimRouter]:
        return lambda: Learned(name, on.scenario.fleet, policy_config,
                               relaunch_s=scenario.relaunch_s,
                               relaunch_interval_s=scenario.relaunch_interval_s,
                               relaunch=relaunch, worker_priors=on.priors)

    # the shipped strategy: on a fixed-k fleet, launch the pools the benchmark of every
    # (method, k) says for an even class mix (nothing is known of the traffic before it
    # arrives; bench/sim/launch.py), then route and relaunch as learned; the same
    # launched from the observed mix is `adaptive-observed-mix`, the configured split
    # routed by the same policy `adaptive-split`
    ours = served(scenario, config, None)
    factories["adaptive"] = learned("adaptive", ours)
    if scenario.fixed_k:
        factories["adaptive-observed-mix"] = learned("adaptive-observed-mix",
                                                     served(scenario, config, mix))
    if lean:
        return factories
    if scenario.fixed_k:
        factories["adaptive-split"] = learned("adaptive-split", Served(
            scenario, worker_priors(scenario, config.world, config.model, config.seed), None))
        factories["adaptive-no-relaunch"] = learned("adaptive-no-relaunch", ours, False)
    scales = tuple(p.drafter_scale for p in config.phases)

    def oracle(name: str, pools: tuple[SimPool, ...], any_k: bool = True,
               per_request: bool = False) -> Callable[[], SimRouter]:
        return lambda: Oracle(name, pools, None, config.base_step_s, scales,
                              TRAINED_DRAFTERS, any_k=any_k, per_request=per_request)

    # the per-class oracle over the fleet the strategy serves on, every pool x k the
    # policy may choose (a fixed-k pool at any k up to its max_k, as if relaunched for
    # free), and the same oracle held to the launched k; `oracle-configured` routes the
    # scenario's configured split (not what the strategy runs on)
    factories["oracle"] = oracle("oracle", ours.scenario.fleet)
    # the per-request oracle: the same, knowing each prompt's own acceptance (the world's
    # per-prompt draw), on every worker able to run every method at any k (`ceiling`'s
    # fleet): what the engines' own adaptive k is held under
    factories["oracle-request"] = oracle("oracle-request", ceiling_fleet(scenario),
                                         per_request=True)
    if scenario.fixed_k:
        factories["oracle-launch-k"] = oracle("oracle-launch-k", ours.scenario.fleet, False)
        factories["oracle-configured"] = oracle("oracle-configured", fleet)
        # the oracle on all 12 workers each able to run every method of the scenario at
        # any k per request (no engine can: not deployable): the ceiling of any routing,
        # sharding or planning on this engine; `ceiling-launched`: the launched methods
        # only (a per-request-k fleet's oracle is its ceiling already)
        factories["ceiling"] = oracle("ceiling", ceiling_fleet(scenario))
        factories["ceiling-launched"] = oracle("ceiling-launched",
                                               ceiling_fleet(ours.scenario))
    return factories


def best_fixed_name(outcomes: dict[str, list[Outcome]], phases: set[int] | None = None
                    ) -> str:
    """The best homogeneous fleet: the fixed (method, k) of the highest mean tokens/s
    (over the requests of `phases`; None: all)."""
    return max((n for n in outcomes if n.startswith("fixed:")),
               key=lambda n: mean_tokens_per_s(outcomes[n], phases))


def mean_tokens_per_s(outcomes: list[Outcome], phases: set[int] | None = None) -> float:
    return float(np.mean([o.tokens_per_s for o in outcomes
                          if phases is None or o.phase in phases]))


def static_rule(outcomes: dict[str, list[Outcome]], fleet: tuple[SimPool, ...]) -> Routed:
    """The two-line rule (`baselines.EditRule`) on `fleet`, read from the homogeneous
    fleets just run: the best one's method and k for every request but edits — the best
    of another method than n-gram where n-gram is best overall (it gets the edits; the
    rest would overload its pool) — and the n-gram k best on the requests labelled
    greedy edits (the best n-gram k over all traffic is small: most of it copies
    nothing)."""
    ngram = [n for n in outcomes if n.startswith("fixed:ngram:")]
    others = {n: out for n, out in outcomes.items() if n not in ngram}
    best = best_fixed_name(others if any(n.startswith("fixed:") for n in others)
                           else outcomes).split(":")

    def on_edits(name: str) -> float:
        edits = [o.tokens_per_s for o in outcomes[name]
                 if o.task == "edit" and o.bucket == "t0"]
        return float(np.mean(edits)) if edits else mean_tokens_per_s(outcomes[name])

    edit = max(ngram, key=on_edits).split(":") if ngram else best
    return edit_rule(fleet, (best[1], int(best[2][1:])), (edit[1], int(edit[2][1:])))


@dataclass
class Run:
    outcomes: dict[str, list[Outcome]]
    routers: dict[str, SimRouter]  # as they ended
    mix: dict[tuple[str, str], float]  # the observed class mix


def run_routers(config: SimConfig, policy_config: PolicyConfig | None = None,
                fixed_ks: tuple[int, ...] = FIXED_KS,
                scenario: Scenario = SCENARIOS["sglang-pools"], lean: bool = False) -> Run:
    """Every router on the same arrivals (`lean`: `routers`'), then the static rule on
    the shipped strategy's fleet, then (not `lean`) the engines' own adaptive k."""
    requests = workload(config)
    outcomes: dict[str, list[Outcome]] = {}
    ended: dict[str, SimRouter] = {}
    mix = observed_mix(requests)
    for name, make in routers(config, policy_config, fixed_ks, scenario, mix, lean).items():
        ended[name] = router = make()
        outcomes[name] = simulate(router, config, requests)
    rule = static_rule(outcomes, ended["adaptive"].fleet)
    ended[rule.name] = rule
    outcomes[rule.name] = simulate(rule, config, requests)
    if not lean:
        for name, run in engine_baselines(config, scenario).items():
            if name == "shard-adaptive" and not scenario.fixed_k:
                continue  # a strategy for fixed-k fleets
            outcomes[name] = run(requests)
    return Run(outcomes, ended, mix)


def evaluate(config: SimConfig, policy_config: PolicyConfig | None = None,
             fixed_ks: tuple[int, ...] = FIXED_KS,
             scenario: Scenario = SCENARIOS["sglang-pools"]) -> Evaluation:
    run = run_routers(config, policy_config, fixed_ks, scenario)
    outcomes, n_phases = run.outcomes, len(config.phases)
    adaptive = run.routers["adaptive"]
    relaunches = len(adaptive.relaunches) if isinstance(adaptive, Learned) else 0
    results = {name: summarize(name, out, n_phases) for name, out in outcomes.items()}
    fixed = {n: r for n, r in results.items() if n.startswith("fixed:")}
    best_fixed = results[best_fixed_name(outcomes)]
    ours, oracle, plain = results["adaptive"], results["oracle"], results["plain"]
    saturation = next(i for i, p in enumerate(config.phases) if p.name == "saturation")
    bounds = np.cumsum([0] + [p.requests for p in config.phases])
    recover = [requests_to_recover(outcomes["adaptive"], outcomes["oracle"], int(bounds[i]),
                                   int(bounds[i + 1])) for i in range(1, n_phases)]
    top = sorted(fixed.values(), key=lambda r: -r.mean_tokens_per_s)[:3]
    never = any(r is None for r in recover)
    ceiling = results.get("ceiling", oracle)
    rule = run.routers["static-rule"]
    summary = {
        "vs_best_homogeneous": ratios(ours, best_fixed),
        "vs_sglang_adaptive_homogeneous": ratios(ours, results["sglang-adaptive"]),
        "vs_oracle": ratios(ours, oracle),
        "vs_static_split": ratios(ours, results["rules"]),
        "vs_oracle_launch_k": (ratios(ours, results["oracle-launch-k"])
                               if "oracle-launch-k" in results else None),
        "oracle_vs_best_homogeneous": ratios(oracle, best_fixed),
        "ceiling_vs_best_homogeneous": ratios(ceiling, best_fixed),
        "vs_ceiling": ratios(ours, ceiling),
        "launched_fleet": served(scenario, config, None).describe,
        "static_rule": {
            "rule": rule.policy.describe() if isinstance(rule.policy, EditRule) else rule.name,
            "vs_best_homogeneous": ratios(results["static-rule"], best_fixed),
            "adaptive_vs_static_rule": ratios(ours, results["static-rule"]),
            "vs_sglang_adaptive_homogeneous": ratios(results["static-rule"],
                                                     results["sglang-adaptive"])},
        "oracle_launched": oracle_launched(results, best_fixed),
        "sglang_adaptive_tuned": {
            "tiers": {str(key): list(candidates) for key, (candidates, _, _) in tuned_tiers(
                benchmark(scenario, config.world, config.seed, config.base_step_s),
                scenario.chain_method).items()},
            "vs_best_homogeneous": ratios(results["sglang-adaptive-tuned"], best_fixed),
            "default_vs_best_homogeneous": ratios(results["sglang-adaptive"], best_fixed),
            "adaptive_vs_tuned": ratios(ours, results["sglang-adaptive-tuned"])},
        "launch_mix": launch_mix(scenario, config, run.mix, results, best_fixed),
        "vllm_adaptive_verification": vllm_baselines(scenario, config, results, best_fixed),
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
    if "adaptive-no-relaunch" in results:  # (Run.routers: the ended routers)
        summary["adaptive_no_relaunch_vs_best_fixed"] = (
            results["adaptive-no-relaunch"].mean_tokens_per_s / best_fixed.mean_tokens_per_s)
    return Evaluation(results, summary, scenario, outcomes)



# the routers that serve on the shipped strategy's fleet (the launched pools)
ON_SERVED = ("adaptive", "adaptive-no-relaunch", "static-rule", "oracle-launch-k")


def oracle_launched(results: dict[str, PolicyResult], best_fixed: PolicyResult) -> dict:
    """The oracle and the ceiling over the fleet the shipped strategy serves on, and
    every router on that fleet against the oracle (an upper bound should be >= 1 of each;
    the per-class oracle maximises each request's marginal output, not the run's, so it
    is a bound only empirically); the old oracle over the configured split, named so."""
    oracle = results["oracle"]
    ceiling = results.get("ceiling-launched", oracle)
    out = {"oracle_vs_best_homogeneous": ratios(oracle, best_fixed),
           "ceiling_vs_best_homogeneous": ratios(ceiling, best_fixed),
           "adaptive_vs_oracle": ratios(results["adaptive"], oracle),
           "routers_vs_oracle": {name: results[name].mean_tokens_per_s
                                 / oracle.mean_tokens_per_s
                                 for name in ON_SERVED if name in results}}
    if "oracle-configured" in results:
        out["configured_split_oracle_vs_best_homogeneous"] = ratios(
            results["oracle-configured"], best_fixed)
    return out


def vllm_baselines(scenario: Scenario, config: SimConfig, results: dict[str, PolicyResult],
                   best_fixed: PolicyResult) -> dict:
    """vLLM's adaptive verification at the k the launch benchmark favours, and vLLM's
    batch table read off the same benchmark for the method it favours (the operator's
    EAGLE table beside it), against
    the best homogeneous fleet, the per-request oracle and `adaptive`."""
    bench = benchmark(scenario, config.world, config.seed, config.base_step_s)
    chain = scenario.chain_method
    av, tuned = results["vllm-adaptive-verification"], results["vllm-table-tuned"]
    request_oracle = results["oracle-request"]
    return {"method": chain, "num_speculative_tokens": verification_k(bench, chain),
            "vs_best_homogeneous": ratios(av, best_fixed),
            "vs_request_oracle": ratios(av, request_oracle),
            "adaptive_vs_verification": ratios(results["adaptive"], av),
            "request_oracle_vs_best_homogeneous": ratios(request_oracle, best_fixed),
            "table_tuned": {
                "method": table_method(bench),
                "schedule": [list(r) for r in tuned_schedule(bench, table_method(bench))],
                "vs_best_homogeneous": ratios(tuned, best_fixed),
                "operator_vs_best_homogeneous": ratios(results["vllm-table"], best_fixed),
                "adaptive_vs_tuned": ratios(results["adaptive"], tuned)}}


def launch_mix(scenario: Scenario, config: SimConfig, mix: dict[tuple[str, str], float],
               results: dict[str, PolicyResult], best_fixed: PolicyResult) -> dict | None:
    """The shipped strategy launched from an even class mix against the same launched
    from the observed mix (None: a per-request-k fleet launches nothing)."""
    if "adaptive-observed-mix" not in results:
        return None
    observed = results["adaptive-observed-mix"]
    return {"observed_mix": {f"{task}/{bucket}": round(share, 4)
                             for (task, bucket), share in mix.items()},
            "observed_fleet": served(scenario, config, mix).describe,
            "even_fleet": served(scenario, config, None).describe,
            "observed_vs_best_homogeneous": ratios(observed, best_fixed),
            "observed_vs_even": ratios(observed, results["adaptive"])}
