"""What the shipped policy predicts on the trace world against what the world delivers.

    python -m bench.traces.diagnose [--traces PATH] [--prompts PATH] [--seed 0] [--json]

For each world and batch, the recorded mix (one seed) is served by the adaptive policy
(bench/traces/adaptive.py) exactly as `specroute bench traces` serves it; before each
request is served, every launched pool's option as the policy ranks it (its predicted
tokens/s, accept length and step time: `accept length / tokens/s`) is set beside what
the world delivers for that request on that pool. Per pool, over every request (not
only those it was sent), weighed as the score weighs them: predicted over delivered
tokens/s (the delivered decode seconds over those the prediction implies for the
request's tokens), accept length (steps delivered over steps implied) and step time;
how the decisions went: how often the policy's greedy top pool was the world's best
launched pool for the request, how many decisions were not the greedy pick (cold-start
tries, exploration) or were held by hysteresis / the plain-pool rule.
Training traces only: diagnosing on held-out figures would be tuning on them.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from bench.traces.adaptive import ENGINE, adaptive, profile_of
from bench.traces.fleets import Costs, PoolSpec, grid, mix_sequence, score_fleets
from bench.traces.run import BATCHES, WORLDS, usable
from bench.traces.world import DATA, load_prompts, load_traces
from policies.decision import Policy
from policies.types import Decision, PoolView, RequestProfile


class Tally:
    """The probe: per pool, predicted and delivered sums; per run, how decisions went."""

    def __init__(self, costs: Costs, launched: list[PoolSpec]) -> None:
        self.costs, self.launched = costs, {p.name: p for p in launched}
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.counts: dict[str, int] = defaultdict(int)

    def __call__(self, rid: str, policy: Policy, profile: RequestProfile,
                 views: list[PoolView], decision: Decision) -> None:
        ranked = policy._rank(*policy._current, profile, views)  # noqa: SLF001
        best = max(self.launched.values(), key=lambda p: self.costs(rid, p).tokens_per_s)
        counts = self.counts
        counts["requests"] += 1
        counts["greedy_is_best"] += ranked.options[0].pool.name == best.name
        counts["chosen_is_best"] += decision.pool == best.name
        counts["not_greedy"] += decision.explored
        counts["held"] += not decision.explored and decision.pool != ranked.options[0].pool.name
        for option in ranked.options:
            served = self.costs(rid, self.launched[option.pool.name])
            s = self.sums[option.pool.name]
            s["pred_s"] += served.tokens / option.tokens_per_s
            s["pred_steps"] += served.tokens / option.accept_length
            s["s"] += served.decode_s
            s["steps"] += served.steps
            s["tokens"] += served.tokens
            s["chosen"] += decision.pool == option.pool.name

    def pools(self) -> dict[str, dict[str, float]]:
        return {name: {"chosen": int(s["chosen"]),
                       "tokens_per_s": s["s"] / s["pred_s"],
                       "accept_length": s["steps"] / s["pred_steps"],
                       "step_s": (s["pred_s"] / s["pred_steps"]) / (s["s"] / s["steps"]),
                       "world_tokens_per_s": s["tokens"] / s["s"]}
                for name, s in sorted(self.sums.items())}


def diagnose(traces: dict, prompts: dict, seed: int = 0,
             worlds: tuple[str, ...] = WORLDS, batches: tuple[int, ...] = BATCHES) -> list[dict]:
    ids = usable(traces, prompts)
    max_k = min(t.k for m in traces.values() for t in m.values() if t.method != "plain")
    model = traces[ids[0]]["plain"].model
    category = {i: traces[i]["plain"].category for i in ids}
    profiles = {i: profile_of(prompts[i], traces[i]["plain"].output_tokens, model)[0]
                for i in ids}
    rows = []
    for world in worlds:
        for batch in batches:
            costs = Costs(traces, world, batch)
            sequence = mix_sequence(ids, category.__getitem__, None, seed)
            scores = score_fleets(costs, sequence, [profiles[r] for r in sequence],
                                  grid(max_k), ENGINE[world])
            tally = Tally(costs, scores.launched)
            run = adaptive(costs, sequence, prompts, scores.launched, world, seed, model,
                           probe=tally)
            best, top = scores.best_homogeneous
            rows.append({"world": world, "batch": batch, "best": best,
                         "adaptive": run.score / top,
                         "oracle_request": scores.oracle_request / top,
                         **{key: tally.counts[key] for key in (
                             "requests", "greedy_is_best", "chosen_is_best", "not_greedy",
                             "held")},
                         "pools": tally.pools()})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| world | batch | pool | sent | predicted / world: tokens/s | accept length "
             "| step time | world tokens/s |", "|---" * 8 + "|"]
    for r in rows:
        for name, p in r["pools"].items():
            lines.append(f"| {r['world']} | {r['batch']} | {name} | {p['chosen']} | "
                         f"{p['tokens_per_s']:.2f} | {p['accept_length']:.2f} | "
                         f"{p['step_s']:.2f} | {p['world_tokens_per_s']:.1f} |")
    lines += ["", "| world | batch | best homogeneous | adaptive | oracle request | greedy "
              "top = world's best | sent to world's best | tries / exploration | held |",
              "|---" * 9 + "|"]
    for r in rows:
        n = r["requests"]
        lines.append(f"| {r['world']} | {r['batch']} | {r['best']} | {r['adaptive']:.3f} | "
                     f"{r['oracle_request']:.3f} | {r['greedy_is_best'] / n:.0%} | "
                     f"{r['chosen_is_best'] / n:.0%} | {r['not_greedy']} | {r['held']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=str(DATA / "smollm2"))
    parser.add_argument("--prompts", default=str(DATA / "prompts.jsonl"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = diagnose(load_traces(Path(args.traces)), load_prompts(Path(args.prompts)),
                    args.seed)
    print(table(rows))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
