"""`specroute bench traces`: recorded acceptance traces replayed for fleets of fixed-k
pools, tokens/s against the best homogeneous fleet at batch 1, 8 and 32.

    specroute bench traces [--traces PATH] [--prompts PATH] [--seeds 0,1,2] [--quick] [--json]

Worlds: `h100` (SpecDecode-Bench's H100 Llama-3.1-8B step fit) and `embedded` (the
embedded engine's measured step costs); bench/traces/world.py. Fleets: bench/traces/
fleets.py and adaptive.py. Mixes: the recorded categories as they are, and copy-heavy
shares 0, 0.2, 0.4 (fleets.COPY_HEAVY). Per replicate (seed) a new order (and draw);
mean and range over replicates. `adaptive` learns from a cold start over the scored
sequence; `adaptive_warm` serves another draw of the same mix first, unscored (a steady
state on the same prompts, not a held-out figure). In the `embedded` world also `prk` and
`prk_warm`: the same, over the pools `specroute up` launches for the embedded engine (one
per method, k chosen per request up to the recorded k), and `oracle_any_k`, the per-request
best of every pool of the grid (the ceiling a per-request k can reach). Then, per fixed-k
pool of the adaptive fleet, the k the
policy would publish for it (policies/desired_k.py `k_scores`) against what the world
measures on that pool's own traffic. Method and figures: docs/TRACES.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from bench.traces.adaptive import ENGINE, Run, adaptive, profile_of
from bench.traces.fleets import (
    COPY_HEAVY,
    KS,
    PLAIN,
    Costs,
    PoolSpec,
    best_by_group,
    grid,
    mix_sequence,
    score_fleets,
    view,
)
from bench.traces.world import DATA, Trace, cut_check, load_prompts, load_traces
from policies.types import RequestProfile

WORLDS = ("h100", "embedded")
BATCHES = (1, 8, 32)
MIXES: tuple[float | None, ...] = (None, 0.0, 0.2, 0.4)
QUICK_PER_CATEGORY = 6
WARMUP_SEED = 1000  # the warm-up pass's draw: another order (and draw) of the same mix
FLEETS = ("plain", "ngram", "eagle", "static", "oracle_class", "oracle_request", "adaptive",
          "adaptive_warm", "oracle_any_k", "prk", "prk_warm")


def mix_name(share: float | None) -> str:
    return "recorded" if share is None else f"copy {share:g}"


def usable(traces: dict[str, dict[str, Trace]], prompts: dict[str, dict]) -> list[str]:
    return sorted(i for i, m in traces.items()
                  if i in prompts and {"plain", "ngram", "eagle"} <= set(m))


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "low": min(values), "high": max(values)}


def desired_k_rows(run: Run, costs: Costs, sequence: list[str], pools: list[PoolSpec],
                   max_k: int, engine: str) -> list[dict]:
    """Per speculative pool: the k the policy's `k_scores` ranks first after the run,
    its predicted gain, and the world's tokens/s at that k over at the launch k, on the
    requests the adaptive run sent to the pool."""
    policy = run.policy
    assert policy is not None
    state = policy.refit()
    rows = []
    for pool in pools:
        if pool.method == "plain":
            continue
        mine = [r for r, d in zip(sequence, run.decisions, strict=True) if d.pool == pool.name]
        scores = policy.desired_k.k_scores(view(pool, costs.batch, engine), state,
                                           float(costs.batch))
        row: dict = {"pool": pool.name, "k": pool.k, "requests": len(mine)}
        if mine:  # the world's curve on the pool's own traffic: tokens/s at k over launch k
            here = costs.score([(r, pool) for r in mine])
            curve = {k: costs.score([(r, PoolSpec(pool.method, k) if k else PLAIN)
                                     for r in mine]) / here for k in (0, *KS) if k <= max_k}
            best = max(curve, key=lambda k: (curve[k], -k))
            row.update(curve=curve, curve_best=best)
        if not scores or not mine:
            rows.append({**row, "wish": None})
            continue
        wish = max(scores, key=lambda k: (scores[k], -k))
        predicted = scores[wish] / max(scores[pool.k], 1e-12)
        measured = row["curve"].get(wish)  # None past the recorded k
        gain = policy.desired_k.relaunch_gain
        rows.append({**row, "wish": wish, "predicted_gain": predicted,
                     "measured_gain": measured, "would_publish": predicted > 1 + gain,
                     "loses": measured is not None and predicted > 1 + gain
                     and measured < 1.0})
    return rows


def per_request_k_fleets(costs: Costs, sequence: list[str], prompts: dict[str, dict],
                         launched: list[PoolSpec], pools: list[PoolSpec], seed: int,
                         model: str, max_k: int, warmup: list[str], unit: str = "class"
                         ) -> dict[str, float]:
    """The embedded engine's per-request-k pools, cold and warm, and the per-request
    best of every pool of the grid (module docstring)."""
    anyk = best_by_group(costs, sequence, [str(i) for i in range(len(sequence))], pools)
    cold = adaptive(costs, sequence, prompts, launched, "embedded", seed, model,
                    per_request_k=max_k, unit=unit)
    warm = adaptive(costs, sequence, prompts, launched, "embedded", seed, model, warmup,
                    per_request_k=max_k, unit=unit)
    return {"oracle_any_k": costs.score(list(zip(sequence, anyk, strict=True))),
            "prk": cold.score, "prk_warm": warm.score}


def route_rows(world: str, batch: int, sequence: list[str], category: dict[str, str],
               run: Run, oracle: list[PoolSpec]) -> list[dict]:
    """Per category: requests the adaptive fleet and the per-request oracle sent to each
    pool."""
    rows: dict[str, dict] = {}
    for rid, decision, best in zip(sequence, run.decisions, oracle, strict=True):
        row = rows.setdefault(category[rid], {"world": world, "batch": batch,
                                              "category": category[rid],
                                              "adaptive": {}, "oracle_request": {}})
        row["adaptive"][decision.pool] = row["adaptive"].get(decision.pool, 0) + 1
        row["oracle_request"][best.name] = row["oracle_request"].get(best.name, 0) + 1
    return [rows[c] for c in sorted(rows)]


def evaluate(traces: dict[str, dict[str, Trace]], prompts: dict[str, dict], seeds: list[int],
             worlds: tuple[str, ...] = WORLDS, batches: tuple[int, ...] = BATCHES,
             mixes: tuple[float | None, ...] = MIXES, unit: str = "class") -> dict:
    ids = usable(traces, prompts)
    max_k = min(t.k for m in traces.values() for t in m.values() if t.method != "plain")
    pools = grid(max_k)
    model = traces[ids[0]]["plain"].model
    profiles: dict[str, RequestProfile] = {
        i: profile_of(prompts[i], traces[i]["plain"].output_tokens, model)[0] for i in ids}
    category = {i: traces[i]["plain"].category for i in ids}
    results: list[dict] = []
    desired: list[dict] = []
    routes: list[dict] = []
    for world in worlds:
        for batch in batches:
            costs = Costs(traces, world, batch)
            for share in mixes:
                per_seed: dict[str, list[float]] = defaultdict(list)
                best_names: list[str] = []
                for seed in seeds:
                    sequence = mix_sequence(ids, category.__getitem__, share, seed)
                    if not sequence:
                        break
                    seen = [profiles[r] for r in sequence]
                    scores = score_fleets(costs, sequence, seen, pools, ENGINE[world])
                    name, top = scores.best_homogeneous
                    best_names.append(name)
                    run = adaptive(costs, sequence, prompts, scores.launched, world, seed, model,
                                   unit=unit)
                    figures = {m: scores.homogeneous[scores.best[m].name] for m in scores.best}
                    # steady state: first a pass over another draw of the mix, not scored
                    warm = adaptive(costs, sequence, prompts, scores.launched, world, seed,
                                    model, mix_sequence(ids, category.__getitem__, share,
                                                        seed + WARMUP_SEED), unit=unit)
                    figures.update(static=scores.static, oracle_class=scores.oracle_class,
                                   oracle_request=scores.oracle_request, adaptive=run.score,
                                   adaptive_warm=warm.score)
                    if world == "embedded":
                        figures.update(per_request_k_fleets(
                            costs, sequence, prompts, scores.launched, pools, seed, model,
                            max_k, mix_sequence(ids, category.__getitem__, share,
                                                seed + WARMUP_SEED), unit))
                    for fleet, value in figures.items():
                        per_seed[fleet].append(value / top)
                    per_seed["best_tokens_per_s"].append(top)
                    if share is None and seed == seeds[0]:
                        routes.extend(route_rows(world, batch, sequence, category, run,
                                                 scores.by_request))
                        for row in desired_k_rows(run, costs, sequence, scores.launched, max_k,
                                                  ENGINE[world]):
                            desired.append({"world": world, "batch": batch, **row})
                if per_seed:
                    results.append({"world": world, "batch": batch, "mix": mix_name(share),
                                    "best_homogeneous": sorted(set(best_names)),
                                    **{f: spread(v) for f, v in per_seed.items()}})
    return {"requests": len(ids), "categories": sorted(set(category.values())),
            "copy_heavy": sorted(COPY_HEAVY & set(category.values())), "seeds": seeds,
            "pools": [p.name for p in pools], "learning_unit": unit, "results": results,
            "desired_k": desired,
            "routes": routes}


def table(report: dict) -> str:
    lines = [f"{report['requests']} requests; pools {', '.join(report['pools'])}; "
             f"copy-heavy categories {', '.join(report['copy_heavy']) or 'none'}; "
             f"seeds {report['seeds']}; the policy learns per "
             f"{report.get('learning_unit', 'class')}",
             "tokens/s over the best homogeneous fleet (mean [low, high] over seeds)", "",
             "| world | mix | batch | best homogeneous | tok/s | " + " | ".join(FLEETS) + " |",
             "|---" * (5 + len(FLEETS)) + "|"]
    for r in report["results"]:
        cells = []
        for fleet in FLEETS:
            s = r.get(fleet)
            cells.append("-" if s is None else
                         f"{s['mean']:.3f}" + ("" if s["high"] - s["low"] < 5e-4
                                               else f" [{s['low']:.3f}, {s['high']:.3f}]"))
        lines.append(f"| {r['world']} | {r['mix']} | {r['batch']} | "
                     f"{'/'.join(r['best_homogeneous'])} | "
                     f"{r['best_tokens_per_s']['mean']:.1f} | " + " | ".join(cells) + " |")
    lines += ["", "desired k (mix recorded, first seed): the k the policy would publish "
              "for each pool vs the world on the pool's own traffic", "",
              "| world | batch | pool | requests | wished k | predicted gain | measured gain "
              "| would publish | loses | the curve's best k (gain) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for d in report["desired_k"]:
        curve = (f"{d['curve_best']} ({d['curve'][d['curve_best']]:.3f})" if "curve" in d
                 else "-")
        if d.get("wish") is None:
            lines.append(f"| {d['world']} | {d['batch']} | {d['pool']} | {d['requests']} | "
                         f"- | - | - | no | no | {curve} |")
            continue
        measured = "-" if d["measured_gain"] is None else f"{d['measured_gain']:.3f}"
        lines.append(f"| {d['world']} | {d['batch']} | {d['pool']} | {d['requests']} | "
                     f"{d['wish']} | {d['predicted_gain']:.3f} | {measured} | "
                     f"{'yes' if d['would_publish'] else 'no'} | "
                     f"{'YES' if d['loses'] else 'no'} | {curve} |")
    lines += ["", "routes (mix recorded, first seed): requests per pool, adaptive | "
              "per-request oracle", "", "| world | batch | category | adaptive | oracle |",
              "|---|---|---|---|---|"]
    for r in report["routes"]:
        lines.append(f"| {r['world']} | {r['batch']} | {r['category']} | "
                     f"{_counts(r['adaptive'])} | {_counts(r['oracle_request'])} |")
    for method, c in report.get("cut_check_k16_to_k8", {}).items():
        lines.append(f"\nk 8 derived from the k 16 recording, {method}: "
                     f"{c['derived_tokens_per_step']:.3f} tokens/step against "
                     f"{c['recorded_tokens_per_step']:.3f} recorded ({c['requests']} requests)")
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{pool} {n}" for pool, n in sorted(counts.items()))


def main(args: argparse.Namespace) -> int:
    traces = load_traces(Path(args.traces) if args.traces else DATA / "smollm2")
    prompts = load_prompts(Path(args.prompts) if args.prompts else DATA / "prompts.jsonl")
    seeds = [int(s) for s in (args.seeds or ("0" if args.quick else "0,1,2")).split(",")]
    if args.quick:  # the first QUICK_PER_CATEGORY requests of each category
        taken: dict[str, int] = defaultdict(int)
        keep = set()
        for rid in usable(traces, prompts):
            category = traces[rid]["plain"].category
            if taken[category] < QUICK_PER_CATEGORY:
                taken[category] += 1
                keep.add(rid)
        traces = {i: m for i, m in traces.items() if i in keep}
    report = evaluate(traces, prompts, seeds, unit=args.learning_unit or "class")
    k16 = DATA / "smollm2-k16" / "traces.jsonl"
    if not args.traces and k16.exists():  # the approximation checked where both k's exist
        high = load_traces(k16)
        report["cut_check_k16_to_k8"] = {m: cut_check(traces, high, m) for m in ("ngram", "eagle")}
    print(table(report))
    if args.json:
        print(json.dumps(report))
    return 0

