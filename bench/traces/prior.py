"""The embedded engine's acceptance prior from recorded traces of public prompts.

    python -m bench.traces.prior [--traces PATH] [--prompts PATH] [--write]

The worker's measured.json (`specroute bench engine`) measured each drafter on 4 of the
project's own prompts per class, n-gram only at k 6, where its acceptance is least like
what it yields at k 1-2. The recorded traces (bench/traces/record.py: 300 prompts from
public sets nobody here wrote, every drafter to k 8) say more: per class as the gateway's
classifier sees each prompt, and per k, the accept length the trace world's walk yields
(bench/traces/world.py) and its tokens/s on the measured step costs. These rows replace
measured.json's greedy n-gram and EAGLE entries (`--write`); the sampled ones, and
EAGLE-2, Medusa and lookahead, which no trace recorded, keep the engine bench's. Only training prompts: the held-out sets
(bench/traces/heldout.py) never reach this file.

Checked before it shipped on a split of the training traces (prior from one half, the
trace world's per-request-k fleet on the other): docs/results/2026-12-07-traced-prior.md.
"""

from __future__ import annotations

import argparse
import json
import zlib
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from bench.traces.adaptive import adaptive, profile_of
from bench.traces.fleets import PLAIN, Costs, PoolSpec, grid, mix_sequence, score_fleets
from bench.traces.world import DATA, LAWS, MEASURED, Trace, load_prompts, load_traces, serve
from policies.prior import Measured, MeasuredEntry

METHODS = ("ngram", "eagle")
KS = (1, 2, 4, 8)
SOURCE = ("ngram and eagle: python -m bench.traces.prior --write (recorded traces of the "
          "training prompts, bench/traces/data/smollm2, walked at k 1, 2, 4, 8 on this "
          "file's step costs)")


def traced_entries(traces: dict[str, dict[str, Trace]], prompts: dict[str, dict],
                   ids: Iterable[str]) -> list[MeasuredEntry]:
    """Per drafter, k and class (the classifier's task of each prompt), at batch 1 and
    temperature 0 (the traces are greedy)."""
    law = LAWS["embedded"]()
    sums: dict[tuple[str, int, str], list[float]] = defaultdict(lambda: [0.0] * 6)
    for rid in ids:
        plain = traces[rid]["plain"]
        task: str = profile_of(prompts[rid], plain.output_tokens, plain.model)[0].task
        base = serve(plain, "plain", 0, 1, law)
        for method in METHODS:
            for k in KS:
                s = serve(traces[rid][method], method, k, 1, law)
                acc = sums[(method, k, task)]
                for i, value in enumerate((s.tokens, s.steps, s.decode_s, base.tokens,
                                           base.decode_s, 1)):
                    acc[i] += value
    out = []
    for (method, k, task), (tokens, steps, seconds, plain_tokens, plain_s, n) in sorted(
            sums.items()):
        tps = tokens / seconds
        out.append(MeasuredEntry(method, k, task, 0.0, round(tokens / steps, 3),
                                 round(tps, 1), round(tps / (plain_tokens / plain_s), 3),
                                 int(n)))
    return out


def with_traced(doc: dict, entries: list[MeasuredEntry]) -> dict:
    """measured.json (as published) with its greedy n-gram and EAGLE entries replaced
    (the traces are greedy: the sampled rows stay the engine bench's)."""
    kept = [e for e in doc["entries"] if e["method"] not in METHODS or e["temperature"] > 0]
    fresh = [{name: getattr(e, name) for name in MeasuredEntry.__slots__} for e in entries]
    source = doc["source"].split("; ngram and eagle:")[0] + "; " + SOURCE
    return {**doc, "source": source, "entries": kept + fresh}


def split_check(traces: dict[str, dict[str, Trace]], prompts: dict[str, dict],
                ids: list[str], doc: dict, baseline: dict, seeds: tuple[int, ...] = (0, 1)
                ) -> list[str]:
    """Rows: on each half of `ids` (split by a hash of the id), the trace world's
    per-request-k fleet (bench/traces/run.py `prk`, cold and warm) over the best
    homogeneous fleet, its embedded workers' prior either `baseline` or `doc` with the
    rows this module derives from the other half only."""
    model = traces[ids[0]]["plain"].model
    category = {i: traces[i]["plain"].category for i in ids}
    profiles = {i: profile_of(prompts[i], traces[i]["plain"].output_tokens, model)[0]
                for i in ids}
    costs = Costs(traces, "embedded", 1)
    launched = [PLAIN, PoolSpec("ngram", 1), PoolSpec("eagle", 1)]
    rows = []
    for half in (0, 1):
        test = [i for i in ids if zlib.crc32(i.encode()) % 2 == half]
        learned = with_traced(doc, traced_entries(
            traces, prompts, [i for i in ids if zlib.crc32(i.encode()) % 2 != half]))
        for share in (None, 0.0, 0.2):
            for seed in seeds:
                sequence = mix_sequence(test, category.__getitem__, share, seed)
                warmup = mix_sequence(test, category.__getitem__, share, seed + 1000)
                scores = score_fleets(costs, sequence, [profiles[r] for r in sequence],
                                      grid(8), "embedded")
                name, top = scores.best_homogeneous
                cells = []
                for prior in (baseline, learned):
                    measured = Measured.from_dict(prior)
                    cold = adaptive(costs, sequence, prompts, launched, "embedded", seed,
                                    model, per_request_k=8, measured=measured)
                    warm = adaptive(costs, sequence, prompts, launched, "embedded", seed,
                                    model, warmup, per_request_k=8, measured=measured)
                    cells += [cold.score / top, warm.score / top]
                mix = "recorded" if share is None else f"copy {share:g}"
                rows.append(f"| {half} | {mix} | {seed} | {name} | "
                            + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default=str(DATA / "smollm2"))
    parser.add_argument("--prompts", default=str(DATA / "prompts.jsonl"))
    parser.add_argument("--write", action="store_true", help=f"rewrite {MEASURED}")
    parser.add_argument("--split-check", metavar="BASELINE",
                        help="a measured.json to compare with, half against half")
    args = parser.parse_args(argv)
    traces = load_traces(Path(args.traces))
    prompts = load_prompts(Path(args.prompts))
    ids = sorted(i for i, m in traces.items()
                 if i in prompts and {"plain", *METHODS} <= set(m))
    with open(MEASURED) as handle:
        doc = json.load(handle)
    entries = traced_entries(traces, prompts, ids)
    print("| method | k | task | accept length | tok/s | speedup | requests |")
    print("|---|---|---|---|---|---|---|")
    for e in entries:
        print(f"| {e.method} | {e.k} | {e.task} | {e.accept_length} | {e.tokens_per_s} | "
              f"{e.speedup} | {e.requests} |")
    if args.split_check:
        with open(args.split_check) as handle:
            baseline = json.load(handle)
        print("\n| half | mix | seed | best homogeneous | baseline cold | baseline warm | "
              "traced (other half) cold | traced warm |\n|---|---|---|---|---|---|---|---|")
        print("\n".join(split_check(traces, prompts, ids, doc, baseline)))
    if args.write:
        MEASURED.write_text(json.dumps(with_traced(doc, entries), indent=1) + "\n")
        print(f"wrote {MEASURED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
