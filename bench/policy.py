"""`specroute bench policy`: the learned policy against baselines in the fleet simulator.

Runs every fleet scenario (bench/sim/scenarios.py: the deployable ones first, the
primary `sglang-pools` leading; the undeployable `sglang-shared` last) on the same arrivals and prints, per scenario, a table (mean tokens/s,
p50/p99 latency, SLO attainment, tokens/s per phase) and the headline ratios. With --json,
one JSON object last: the primary scenario's headline keys at the top level and every
scenario's figures under `scenarios`. --plot FILE.png draws the primary scenario:
tokens/s over simulated time (adaptive, oracle, best fixed, plain; drift points marked)
and the k the policy chose per request class. --quick runs a tenth of the requests on a
smaller grid of fixed k.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.sim.evaluation import FIXED_KS, Evaluation, PolicyResult, evaluate
from bench.sim.scenarios import PRIMARY, SCENARIOS
from bench.sim.simulator import Outcome, SimConfig, default_phases
from bench.sim.world import World
from policies.decision import PolicyConfig

QUICK_SCALE = 0.1
QUICK_FIXED_KS = (1, 2, 4, 8)


def main(args: argparse.Namespace) -> int:
    if getattr(args, "fleet", False):
        from bench.fleet import main as fleet_main

        return fleet_main(args)
    started = time.perf_counter()
    config = SimConfig(default_phases(QUICK_SCALE if args.quick else 1.0), seed=args.seed,
                       world=World())
    fixed_ks = QUICK_FIXED_KS if args.quick else FIXED_KS
    order = [PRIMARY] + [name for name in SCENARIOS if name != PRIMARY]
    evaluations: dict[str, Evaluation] = {}
    for name in order:
        scenario_started = time.perf_counter()
        evaluation = evaluate(config, PolicyConfig(seed=args.seed), fixed_ks, SCENARIOS[name])
        evaluations[name] = evaluation
        tag = " (primary)" if name == PRIMARY else ""
        tag += "" if SCENARIOS[name].deployable else " (UNDEPLOYABLE)"
        print(f"== scenario {name}{tag}: "
              f"{SCENARIOS[name].notes}")
        print(_table(evaluation, config))
        print(_headline(evaluation.summary, time.perf_counter() - scenario_started))
        print()
    elapsed = time.perf_counter() - started
    print(f"wall {elapsed:.1f}s for {len(order)} scenarios")
    if args.plot:
        _plot(evaluations[PRIMARY], config, args.plot)
        print(f"plot written to {args.plot} (scenario {PRIMARY})")
    if args.json:
        out = _scenario_dict(evaluations[PRIMARY])
        out["primary_scenario"] = PRIMARY
        out["wall_s"] = round(elapsed, 2)
        out["scenarios"] = {name: _scenario_dict(e) for name, e in evaluations.items()}
        print(json.dumps(out, default=float))
    return 0


def _scenario_dict(evaluation: Evaluation) -> dict:
    out = dict(evaluation.summary)
    out["table"] = [_row_dict(r) for r in _shown(evaluation)]
    return out


def _shown(evaluation: Evaluation) -> list[PolicyResult]:
    results = evaluation.results
    fixed = sorted((r for n, r in results.items() if n.startswith("fixed:")),
                   key=lambda r: -r.mean_tokens_per_s)
    head = [results[n] for n in ("adaptive", "adaptive-flat-prior", "adaptive-no-relaunch",
                                 "oracle") if n in results]
    tail = [results[n] for n in ("sglang-ema", "vllm-table", "rules", "plain") if n in results]
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
    recover = ", ".join(f"{k}: {v if v is not None else 'never'}"
                        for k, v in summary["recovery_per_drift"].items())
    return (f"adaptive / oracle          {summary['adaptive_vs_oracle']:.3f}  (target >= 0.95)\n"
            f"adaptive / best fixed      {summary['adaptive_vs_best_fixed']:.3f}  "
            f"(target >= 1.15; best fixed {summary['best_fixed']}, oracle / best fixed "
            f"{summary['oracle_vs_best_fixed']:.3f})\n"
            f"adaptive / SGLang EMA      {summary['adaptive_vs_sglang_ema']:.3f}  (target >= 1.15)"
            f"   / vLLM table {summary['adaptive_vs_vllm_table']:.3f}"
            f"   / rules {summary['adaptive_vs_rules']:.3f}\n"
            f"flat prior: / oracle {summary['flat_prior_vs_oracle']:.3f}   / best fixed "
            f"{summary['flat_prior_vs_best_fixed']:.3f}   / SGLang EMA "
            f"{summary['flat_prior_vs_sglang_ema']:.3f}\n"
            f"adaptive / plain, saturated {summary['adaptive_vs_plain_at_saturation']:.3f}  "
            f"(target >= 0.98)\n"
            f"requests to recover        {summary['requests_to_recover_after_drift']}  "
            f"(target <= 500; per drift: {recover})\n"
            f"explored                   {summary['adaptive_explored_fraction']:.1%}  "
            f"(cap 5%)   relaunches {summary['adaptive_relaunches']}   wall {elapsed:.1f}s")


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
    for task, color in (("code", "C2"), ("structured", "C3"), ("chat", "C4")):
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
