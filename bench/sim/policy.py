"""`specroute bench policy`: the shipped strategy against baselines in the fleet simulator.

Runs the three deployable fleets (`sglang`: SGLang fixed-k pools, the primary; `vllm`:
vLLM fixed-k pools; `embedded`: the embedded engine's per-request k; bench/sim/
scenarios.py) for each seed (`--seeds`, default 0 and 7) on the same arrivals, and prints
per fleet and seed a table (mean tokens/s, p50/p99 latency, SLO attainment, tokens/s per
phase) and the headline ratios. With --json, one JSON object last: `fleets` ->
fleet -> seed -> `vs_best_homogeneous`, `vs_sglang_adaptive_homogeneous`, `vs_oracle`,
`vs_static_split` (each [overall, phase 1, ...]), `recovery_requests` (null: never), the
best homogeneous configurations' names, every strategy's ratios and the table, and:
`copy_share_curve` (the headline at edit share 0, 0.05, 0.1, 0.2, with and without the
fine-tune phase: bench/sim/sharecurve.py), `static_rule` (edit -> n-gram, else the best
homogeneous fleet's method, on the launched fleet), `oracle_launched` (the oracle and the
ceiling over the fleet the strategy was launched on, every router on it against the
oracle), `launch_mix` (the launch from the observed class mix against the even one the
strategy ships with), `vllm_adaptive_verification` (vLLM's adaptive verification at the
k the launch benchmark favours, against the best homogeneous fleet and the per-request
oracle; `table_tuned`: vLLM's batch table read off the same benchmark); the
primary fleet's first seed's figures also at the top level. The default run is
`SCALE` of the full workload (3,150 requests per seed; 10,500 with `--full`; `scale` on
the arguments, when set, overrides both); --quick runs a tenth on a smaller grid of
fixed k. --plot FILE.png draws the primary fleet's first seed.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import numpy as np

from bench.sim.evaluation import FIXED_KS, Evaluation, PolicyResult, evaluate
from bench.sim.scenarios import SCENARIOS
from bench.sim.sharecurve import copy_share_curve, curve_table
from bench.sim.simulator import EDIT_SHARE, Outcome, SimConfig, default_phases
from bench.sim.world import World
from policies.decision import PolicyConfig

QUICK_SCALE = 0.1
SCALE = 0.3
QUICK_FIXED_KS = (1, 2, 4, 8)
DEFAULT_SEEDS = (0, 7)
FLEETS = {"sglang": "sglang-pools", "vllm": "vllm", "embedded": "embedded"}
PRIMARY = "sglang"


def main(args: argparse.Namespace) -> int:
    if getattr(args, "fleet", False):
        from bench.sim.fleet import main as fleet_main

        return fleet_main(args)
    started = time.perf_counter()
    seeds = _seeds(getattr(args, "seeds", None))
    scale = getattr(args, "scale", None) or (
        QUICK_SCALE if args.quick else (1.0 if getattr(args, "full", False) else SCALE))
    fixed_ks = QUICK_FIXED_KS if args.quick else FIXED_KS
    share = getattr(args, "edit_share", None)
    share = EDIT_SHARE if share is None else share
    out: dict = {"fleets": {name: {} for name in FLEETS}, "seeds": list(seeds),
                 "scale": scale, "edit_share": share}
    first: Evaluation | None = None
    for seed in seeds:
        config = SimConfig(default_phases(scale, share), seed=seed, world=World())
        for fleet, scenario in FLEETS.items():
            fleet_started = time.perf_counter()
            evaluation = evaluate(config, PolicyConfig(seed=seed), fixed_ks,
                                  SCENARIOS[scenario])
            first = first or evaluation
            tag = " (primary)" if fleet == PRIMARY else ""
            print(f"== fleet {fleet}{tag}, seed {seed}: {SCENARIOS[scenario].notes}")
            print(_table(evaluation, config))
            print(_headline(evaluation.summary, time.perf_counter() - fleet_started))
            curve = copy_share_curve(partial(_config, scale, seed), PolicyConfig(seed=seed),
                                     fixed_ks, SCENARIOS[scenario],
                                     done=(share, evaluation.outcomes))
            print(f"-- the headline by edit share (fleet {fleet}, seed {seed}, scale {scale})")
            print(curve_table(curve))
            print()
            out["fleets"][fleet][str(seed)] = _scenario_dict(evaluation)
            out["fleets"][fleet][str(seed)]["copy_share_curve"] = curve
    elapsed = time.perf_counter() - started
    print(f"wall {elapsed:.1f}s for {len(FLEETS)} fleets x {len(seeds)} seeds")
    if args.plot and first is not None:
        _plot(first, SimConfig(default_phases(scale, share), seed=seeds[0], world=World()),
              args.plot)
        print(f"plot written to {args.plot} (fleet {PRIMARY}, seed {seeds[0]})")
    if args.json:
        top = dict(out["fleets"][PRIMARY][str(seeds[0])])
        top.update(out, primary_fleet=PRIMARY, wall_s=round(elapsed, 2))
        print(json.dumps(top, default=float))
    return 0


def _config(scale: float, seed: int, share: float) -> SimConfig:
    return SimConfig(default_phases(scale, share), seed=seed, world=World())


def _seeds(text: str | None) -> tuple[int, ...]:
    if not text:
        return DEFAULT_SEEDS
    return tuple(int(part) for part in text.split(",") if part.strip())


def _scenario_dict(evaluation: Evaluation) -> dict:
    out = dict(evaluation.summary)
    out["table"] = [_row_dict(r) for r in _shown(evaluation)]
    return out


def _shown(evaluation: Evaluation) -> list[PolicyResult]:
    results = evaluation.results
    fixed = sorted((r for n, r in results.items() if n.startswith("fixed:")),
                   key=lambda r: -r.mean_tokens_per_s)
    head = [results[n] for n in ("adaptive", "adaptive-no-relaunch", "adaptive-observed-mix",
                                 "adaptive-split", "static-rule", "oracle", "oracle-launch-k",
                                 "oracle-configured", "oracle-request", "ceiling-launched",
                                 "ceiling")
            if n in results]
    tail = [results[n] for n in ("sglang-adaptive", "sglang-adaptive-tuned", "shard-adaptive",
                                 "vllm-table", "vllm-table-tuned", "vllm-adaptive-verification",
                                 "rules", "plain") if n in results]
    return head + fixed[:5] + tail


def _row_dict(r: PolicyResult) -> dict:
    return {"policy": r.name, "tokens_per_s": round(r.mean_tokens_per_s, 2),
            "p50_s": round(r.p50_latency_s, 3), "p99_s": round(r.p99_latency_s, 3),
            "slo": round(r.slo_attainment, 4),
            "phase_tokens_per_s": [round(x, 2) for x in r.phase_tokens_per_s]}


def _table(evaluation: Evaluation, config: SimConfig) -> str:
    phases = [p.name for p in config.phases]
    head = (f"{'policy':<22}{'tok/s':>8}{'p50 s':>8}{'p99 s':>8}{'SLO':>7}"
            + "".join(f"{name:>13}" for name in phases))
    lines = [head, "-" * len(head)]
    for r in _shown(evaluation):
        lines.append(f"{r.name:<22}{r.mean_tokens_per_s:>8.1f}{r.p50_latency_s:>8.2f}"
                     f"{r.p99_latency_s:>8.2f}{r.slo_attainment:>7.1%}"
                     + "".join(f"{x:>13.1f}" for x in r.phase_tokens_per_s))
    n_fixed = sum(1 for n in evaluation.results if n.startswith("fixed:"))
    lines.append(f"({n_fixed} fixed (method, k) configurations run; the best 5 shown; "
                 f"{evaluation.summary['requests']} requests, seed {config.seed})")
    return "\n".join(lines)


def _headline(summary: dict, elapsed: float) -> str:
    def show(key: str) -> str:
        return _show(summary[key])

    recover = ", ".join(f"{k}: {v if v is not None else 'never'}"
                        for k, v in summary["recovery_per_drift"].items())
    strategies = "; ".join(f"{name} {figures['vs_best_homogeneous'][0]:.3f}"
                           for name, figures in summary["strategies"].items())
    return (f"adaptive / best homogeneous    {show('vs_best_homogeneous')}  (target >= 1.10, "
            f">= 1.0 per phase; best {', '.join(summary['best_homogeneous'])})\n"
            f"adaptive / SGLang adaptive     {show('vs_sglang_adaptive_homogeneous')}  "
            f"(target >= 1.10)\n"
            f"adaptive / SGLang tuned tiers  "
            f"{_show(summary['sglang_adaptive_tuned']['adaptive_vs_tuned'])}  (candidates "
            f"{summary['sglang_adaptive_tuned']['tiers']})\n"
            f"adaptive / oracle              {show('vs_oracle')}  (target >= 0.95)\n"
            f"adaptive / static split        {show('vs_static_split')}\n"
            f"adaptive / static rule         "
            f"{_show(summary['static_rule']['adaptive_vs_static_rule'])}  "
            f"({summary['static_rule']['rule']})\n"
            f"adaptive / ceiling             {show('vs_ceiling')}\n"
            f"ceiling / best homogeneous     {show('ceiling_vs_best_homogeneous')}  (every "
            f"method at any k per request on every worker: what no routing can exceed)\n"
            f"recovery after drift           {summary['recovery_requests']}  (target <= 500;"
            f" null = never; per drift: {recover})\n"
            f"strategies / best homogeneous  {strategies}\n"
            f"explored {summary['adaptive_explored_fraction']:.1%} (cap 5%)   relaunches "
            f"{summary['adaptive_relaunches']}   launched {summary['launched_fleet']}   "
            f"wall {elapsed:.1f}s")


def _show(figures: list[float]) -> str:
    overall, *phases = figures
    return f"{overall:.3f} (phases " + " ".join(f"{x:.3f}" for x in phases) + ")"


def _binned(outcomes: list[Outcome], edges: np.ndarray, value) -> np.ndarray:
    times = np.array([o.arrival_s for o in outcomes])
    values = np.array([value(o) for o in outcomes], dtype=float)
    index = np.clip(np.digitize(times, edges) - 1, 0, len(edges) - 2)
    sums = np.bincount(index, values, len(edges) - 1)
    counts = np.bincount(index, None, len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts


def _plot(evaluation: Evaluation, config: SimConfig, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outcomes = evaluation.outcomes
    end = max(o.arrival_s for o in outcomes["plain"])
    edges = np.linspace(0.0, end, 81)
    centers = 0.5 * (edges[1:] + edges[:-1])
    best_fixed = evaluation.summary["best_fixed"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    for name, style in (("oracle", "k--"), ("adaptive", "C0-"), (best_fixed, "C1-"),
                        ("plain", "C7-")):
        top.plot(centers, _binned(outcomes[name], edges, lambda o: o.tokens_per_s), style,
                 label=name)
    ours = outcomes["adaptive"]
    for task, color in (("code", "C2"), ("structured", "C3"), ("chat", "C4"), ("edit", "C5")):
        mine = [o for o in ours if o.task == task]
        bottom.plot(centers, _binned(mine, edges, lambda o: o.k), color=color, label=task)
    starts = [min(o.arrival_s for o in ours if o.phase == i) for i in range(len(config.phases))]
    for axis in (top, bottom):
        for start, phase in zip(starts[1:], config.phases[1:], strict=True):
            axis.axvline(start, color="grey", linestyle=":")
            if axis is top:
                axis.text(start, axis.get_ylim()[1] * 0.97, f" {phase.name}", va="top",
                          fontsize=8)
    top.set_ylabel("tokens/s per request")
    top.legend(loc="lower left", fontsize=8)
    bottom.set_ylabel("mean k chosen (adaptive)")
    bottom.set_xlabel("simulated time (s)")
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
