"""The policy's learning unit, per class against per pool, on the training traces only.

    python -m bench.traces.unit_check [--seeds 0,1,2] [--worlds h100,embedded] [--json]

`PolicyConfig.learning_unit` "class" learns each drafter's acceptance per class and
scales it by the request's prediction against its class's mean; "pool" learns one per
(model, method, temperature bucket) for every class and scales it by the prediction
against the mean of every request (`RequestProfile.pooled_scales`). Which one to ship is
chosen here, on the 300 training prompts' traces, never on the held-out sets: split in
halves by a hash of the id (as `bench.traces.prior --split-check`), each half is run with
a drafter predictor and an embedded prior fitted on the other half only, so neither mode
sees the predictor's own training rows. Per half, world, batch, mix and seed, both modes
run the same sequences over the same fleets (bench/traces/run.py: `adaptive` and
`adaptive_warm` over the launched fixed-k pools; in the embedded world also `prk` and
`prk_warm`, the per-request-k pools `specroute up` launches), each over the sequence's
best homogeneous fleet. The table: per world, fleet and mix, the mean over halves, batches
and seeds for each mode, and how many cells "pool" wins.
"""

from __future__ import annotations

import argparse
import json
import statistics
import zlib
from collections import defaultdict
from pathlib import Path

from bench.traces.adaptive import Run, adaptive, profile_of
from bench.traces.fleets import PLAIN, Costs, PoolSpec, grid, mix_sequence, score_fleets
from bench.traces.prior import traced_entries, with_traced
from bench.traces.run import BATCHES, WARMUP_SEED, mix_name, usable
from bench.traces.world import DATA, MEASURED, load_prompts, load_traces
from bench.training.predictor.data import load_rows
from bench.training.predictor.train import fit
from policies.decision import LEARNING_UNITS
from policies.predictor import Predictor
from policies.prior import Measured

MIXES: tuple[float | None, ...] = (None, 0.0, 0.2)


def half_of(rid: str) -> int:
    return zlib.crc32(rid.encode()) % 2


def cells(traces: dict, prompts: dict, seeds: list[int], worlds: list[str]) -> list[dict]:
    """One row per (half, world, batch, mix, seed, fleet): each mode's score over the best
    homogeneous fleet's."""
    ids = usable(traces, prompts)
    model = traces[ids[0]]["plain"].model
    category = {i: traces[i]["plain"].category for i in ids}
    rows = load_rows()
    with open(MEASURED) as handle:
        shipped = json.load(handle)
    out = []
    for half in (0, 1):
        test = [i for i in ids if half_of(i) == half]
        train = [i for i in ids if half_of(i) != half]
        predictor = Predictor(fit([r for r in rows if r.id in set(train)]))
        measured = Measured.from_dict(with_traced(shipped, traced_entries(traces, prompts,
                                                                          train)))
        profiles = {i: profile_of(prompts[i], traces[i]["plain"].output_tokens, model,
                                  predictor)[0] for i in test}
        for world in worlds:
            for batch in BATCHES:
                costs = Costs(traces, world, batch)
                for share in MIXES:
                    for seed in seeds:
                        sequence = mix_sequence(test, category.__getitem__, share, seed)
                        warmup = mix_sequence(test, category.__getitem__, share,
                                              seed + WARMUP_SEED)
                        scores = score_fleets(costs, sequence, [profiles[r] for r in sequence],
                                              grid(8), "sglang" if world == "h100"
                                              else "embedded")
                        top = scores.best_homogeneous[1]
                        prior = measured if world == "embedded" else None
                        fleets: dict[str, tuple[list, int]] = {
                            "adaptive": (scores.launched, 0),
                            "adaptive_warm": (scores.launched, 0)}
                        if world == "embedded":
                            launched = [PLAIN, PoolSpec("ngram", 1), PoolSpec("eagle", 1)]
                            fleets.update(prk=(launched, 8), prk_warm=(launched, 8))
                        for fleet, (pools, max_k) in fleets.items():
                            row = {"half": half, "world": world, "batch": batch,
                                   "mix": mix_name(share), "seed": seed, "fleet": fleet}
                            for unit in LEARNING_UNITS:
                                run: Run = adaptive(
                                    costs, sequence, prompts, pools, world, seed, model,
                                    warmup if fleet.endswith("_warm") else (),
                                    per_request_k=max_k, measured=prior, unit=unit,
                                    predictor=predictor)
                                row[unit] = run.score / top
                            out.append(row)
    return out


def table(rows: list[dict]) -> str:
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["world"], r["fleet"], r["mix"])].append(r)
    lines = ["| world | fleet | mix | cells | class | pool | pool wins |", "|---" * 7 + "|"]
    for (world, fleet, mix), members in groups.items():
        wins = sum(r["pool"] > r["class"] + 1e-9 for r in members)
        ties = sum(abs(r["pool"] - r["class"]) <= 1e-9 for r in members)
        lines.append(f"| {world} | {fleet} | {mix} | {len(members)} | "
                     f"{statistics.fmean(r['class'] for r in members):.3f} | "
                     f"{statistics.fmean(r['pool'] for r in members):.3f} | "
                     f"{wins} ({ties} ties) |")
    every = [r["pool"] - r["class"] for r in rows]
    lines.append(f"\nall {len(rows)} cells: pool - class mean {statistics.fmean(every):+.4f}, "
                 f"pool ahead in {sum(d > 1e-9 for d in every)}, behind in "
                 f"{sum(d < -1e-9 for d in every)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--worlds", default="h100,embedded")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    traces = load_traces(DATA / "smollm2")
    prompts = load_prompts(Path(DATA / "prompts.jsonl"))
    rows = cells(traces, prompts, [int(s) for s in args.seeds.split(",")],
                 args.worlds.split(","))
    print(table(rows))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
