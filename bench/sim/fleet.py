"""`specroute bench policy --fleet`: the fleet planner's fixed-k fleet in the simulator
(bench/sim/planned.py) against the best single fixed configuration, SGLang's adaptive
EAGLE pool and the static split, per phase, with the targets met or missed.

Rows: `planner` starts as the static split and moves workers as the planner asks;
`planner-launched` starts where the planner wants the fleet before any traffic (the
workers' priors, an even class mix) and then moves; `planner-launched-frozen` starts
there and never moves: launched / frozen per phase says whether that phase's relaunches
won more than they cost. `planner-measured` and `planner-measured-frozen` are the same
two with the planner's speed read from the launch benchmark of every (method, k), the
learned acceptance as a drift on it (policies/planner/inputs.py `measured_speed`), on a
pool per configuration measured best for some class or the mix. `launched` is the
shipped strategy (the fleet launched from the benchmark by the per-class launch rule,
bench/sim/launch.py). For each engine (SGLang, vLLM), a
move pays the engine's server start after its drain, read from the repo's records
(bench/sim/relaunch.py: SGLang 90 s; a vLLM CPU server's eager start 30-40 s, whose
measured drain + relaunch was 93 s). 0.3 of the full workload by default (--full: 10,500
requests);
--quick runs a tenth of the requests on a smaller grid of k.
"""

from __future__ import annotations

import argparse
import json
import time

from bench.sim import relaunch
from bench.sim.evaluation import FIXED_KS
from bench.sim.planned import PLANNER_ROWS, START_S, compare
from bench.sim.scenarios import SCENARIOS
from bench.sim.simulator import SimConfig, default_phases
from bench.sim.world import World
from policies.decision import PolicyConfig

QUICK_SCALE = 0.1
SCALE = 0.3  # as `specroute bench policy` (bench/sim/policy.py); --full: 1.0
QUICK_FIXED_KS = (2, 3, 4, 6)
TARGETS = (("best fixed", None, 1.0), ("SGLang adaptive", "sglang-adaptive", 1.0),
           ("static split", "static-split", 1.10))


ENGINES = {"sglang": "sglang-pools", "vllm": "vllm"}


def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    scale = QUICK_SCALE if args.quick else (1.0 if getattr(args, "full", False) else SCALE)
    config = SimConfig(default_phases(scale), seed=args.seed, world=World())
    out: dict = {"relaunch_records_s": relaunch.records(), "engines": {}}
    for engine, scenario in ENGINES.items():
        out["engines"][engine] = _engine(engine, SCENARIOS[scenario], config, args)
    print(f"wall {time.perf_counter() - started:.1f}s")
    if args.json:
        print(json.dumps(out, default=float))
    return 0


def _engine(engine: str, base, config: SimConfig, args: argparse.Namespace) -> dict:
    start_s = START_S[engine]
    result = compare(config, PolicyConfig(seed=args.seed),
                     QUICK_FIXED_KS if args.quick else FIXED_KS, start_s, base)
    phases = result.phases
    print(f"== fleet planner ({base.name}-planned, {engine}): relaunch {start_s:.0f} s after "
          f"the drain, read from the repo's records (bench/sim/relaunch.py)")
    head = (f"{'policy':<25}{'tok/s':>8}{'p50 s':>8}{'p99 s':>8}{'SLO':>7}"
            + "".join(f"{name:>13}" for name in phases))
    print(head + "\n" + "-" * len(head))
    for name in (*PLANNER_ROWS, "launched", "static-split", "sglang-adaptive",
                 result.best_fixed):
        r = result.results[name]
        print(f"{name:<25}{r.mean_tokens_per_s:>8.1f}{r.p50_latency_s:>8.2f}"
              f"{r.p99_latency_s:>8.2f}{r.slo_attainment:>7.1%}"
              + "".join(f"{x:>13.1f}" for x in r.phase_tokens_per_s))
    n_fixed = sum(1 for n in result.results if n.startswith("fixed:"))
    print(f"(best of {n_fixed} fixed (method, k) configurations: {result.best_fixed}; "
          f"{sum(p.requests for p in config.phases)} requests, seed {config.seed})")
    summary: dict = {"best_fixed": result.best_fixed, "relaunch_s": start_s, "ratios": {}}
    for ours in ("planner", "planner-launched", "planner-measured", "launched"):
        for label, baseline, target in TARGETS:
            overall, per_phase = result.ratio(baseline or result.best_fixed, ours)
            met = all(x >= target for x in (overall, *per_phase))
            print(f"{ours + ' / ' + label:<36}{overall:>7.3f}  per phase "
                  + " ".join(f"{x:.3f}" for x in per_phase)
                  + f"  (target >= {target:.2f} in every phase: {'met' if met else 'MISSED'})")
            summary["ratios"][f"{ours}/{label}"] = [overall, *per_phase]
    for moving in ("planner-launched", "planner-measured"):
        _, paid = result.ratio(f"{moving}-frozen", moving)
        print(f"relaunches won / cost ({moving}) per phase "
              + " ".join(f"{x:.3f}" for x in paid)
              + "  (/ frozen; < 1: the phase's relaunches cost more than they won)")
        summary["relaunches_paid" if moving == "planner-launched"
                else f"{moving}_relaunches_paid"] = list(paid)
    for name in PLANNER_ROWS:
        moves = result.moves[name]
        per_phase = [sum(1 for t, _, _ in moves if result.phase_of(t) == i)
                     for i in range(len(phases))]
        first = result.plans[name][0][1] if result.plans[name] else None
        print(f"{name}: {len(moves)} relaunches (done, per phase {per_phase})"
              + (f"; launched as {_fleet(first.desired)}" if name != "planner" and first
                 else ""))
        summary[f"{name}_relaunches"] = per_phase
    summary["table"] = {name: {"tokens_per_s": r.mean_tokens_per_s,
                               "phase_tokens_per_s": list(r.phase_tokens_per_s)}
                        for name, r in result.results.items()}
    print()
    return summary


def _fleet(desired: dict[str, int]) -> str:
    return ", ".join(f"{p} x{n}" for p, n in sorted(desired.items()) if n > 0)
