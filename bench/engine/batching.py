"""`specroute bench batching`: what a decode step costs as sequences are batched together.

Drives the engine in-process the way the worker's scheduler does: N requests started
together, every step one `Engine.step` over all unfinished ones (one batched target
forward over each request's root + draft tokens).

Step costs (always): for batch 1, 2 and 4 and every method at k 1, 2, 4 and the fleet's
default k (plain: k 0), the mean seconds per decode step, drafting included, on chat
prompts of the bench workload (greedy, ignore_eos). Each setting starts its requests,
steps once past prefill, then times `--steps` decode steps (default 24); prefill is never
timed. Settings run in rounds (default 2) whose order rotates, so machine noise hits them
alike; each figure is the median over rounds, its steps summed. `--write-costs PATH`
replaces the `costs` list of the measured.json at PATH (the policy's cost prior,
policies/prior.py `MeasuredCost`), keeps everything else, and records the command in
`costs_source`. `--quick`: batch 1 and 2, the default k only, 4 steps, 1 round.

Throughput (`--throughput`): aggregate tokens/s = all completion tokens / wall time,
prefill included, plain at concurrency 1, 2 and 4 and every method at 1 and 4, over the
same four prompts (one a task) served that many at a time: what
batching buys plain decoding, and speculation's margin shrinking with load.

    SPECROUTE_BENCH_THREADS=1 specroute bench batching --model tiny [--write-costs PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.engine.methods import _k, _load_engine
from bench.workload import TASKS, prompts
from workers.models import resolve_model

CONCURRENCY = (1, 2, 4)


def run_together(engine, requests: list[list[int]], method: str, max_tokens: int,
                 seed: int) -> tuple[int, float, int]:
    """Start every request, step them together until all finish: (tokens, seconds, steps)."""
    from workers.embedded.engine import SamplingParams

    started = time.perf_counter()
    gens = [engine.start(ids, SamplingParams(max_new_tokens=max_tokens, ignore_eos=True,
                                             seed=seed + i), method, _k(engine, method))
            for i, ids in enumerate(requests)]
    steps = 0
    while active := [g for g in gens if not g.finished]:
        for out in engine.step(active):
            if isinstance(out, Exception):
                raise out
        steps += 1
    return sum(g.stats.completion_tokens for g in gens), time.perf_counter() - started, steps


def _prompt_ids(engine, n: int, seed: int) -> list[list[int]]:
    per_task = -(-n // len(TASKS))
    chats = [p for task in TASKS for p in prompts(task, per_task, seed)]
    return [engine.tokenizer.encode_chat(list(p.messages)) for p in chats][:n]


def _summary(rates: list[float]) -> str:
    return f"{statistics.median(rates):7.1f} [{min(rates):.1f}-{max(rates):.1f}]"


def measure(engine, methods: list[str], rounds: int, max_tokens: int,
            seed: int) -> dict[tuple[str, int], list[float]]:
    """Aggregate tokens/s per (method, concurrency), one figure per round.

    Every setting serves the same prompts (one of each task), `concurrency` at a time:
    at 1 they run one after another. Comparing 4 prompts at once with the first prompt
    alone, as this did, set a 242-token edit prompt's prefill against a 35-token code
    prompt's and understated what batching buys."""
    ids = _prompt_ids(engine, max(CONCURRENCY), seed)
    settings = [("plain", c) for c in CONCURRENCY]
    settings += [(m, c) for m in methods if m != "plain" for c in (1, max(CONCURRENCY))]
    rates: dict[tuple[str, int], list[float]] = {s: [] for s in settings}
    for r in range(rounds):
        shift = r % len(settings)
        for method, concurrency in settings[shift:] + settings[:shift]:
            runs = [run_together(engine, ids[s: s + concurrency], method, max_tokens,
                                 seed + 100 * r + s)
                    for s in range(0, len(ids), concurrency)]
            rates[(method, concurrency)].append(sum(t for t, _, _ in runs)
                                                / sum(sec for _, sec, _ in runs))
    return rates


def format_report(rates: dict[tuple[str, int], list[float]], methods: list[str]) -> str:
    top = max(CONCURRENCY)
    plain = {c: statistics.median(rates[("plain", c)]) for c in CONCURRENCY}
    lines = ["| plain, concurrent requests | aggregate tokens/s median [range] | vs 1 |",
             "|---|---|---|"]
    for c in CONCURRENCY:
        lines.append(f"| {c} | {_summary(rates[('plain', c)])} | {plain[c] / plain[1]:.2f}x |")
    lines += ["", f"| method | tokens/s at 1 | vs plain at 1 | tokens/s at {top} | "
              f"vs plain at {top} |", "|---|---|---|---|---|"]
    for m in methods:
        one, many = statistics.median(rates[(m, 1)]), statistics.median(rates[(m, top)])
        lines.append(f"| {m} | {one:.1f} | {one / plain[1]:.2f}x | {many:.1f} | "
                     f"{many / plain[top]:.2f}x |")
    return "\n".join(lines)


# ---- step costs: seconds per decode step by (method, k, batch), the policy's cost prior ----

COST_BATCHES = (1, 2, 4)
COST_KS = (1, 2, 4)  # besides each method's fleet default k
CostKey = tuple[str, int, int]  # (method, k, batch)


@dataclass
class CostTally:
    """One (method, k, batch) setting: mean seconds per decode step in each round, the
    decode steps behind them, and the draft tokens each sequence verified per step."""

    step_s: list[float] = field(default_factory=list)
    steps: int = 0
    draft_tokens: float = 0.0  # summed over steps and sequences

    def add(self, seconds: float, steps: int, draft_tokens: float) -> None:
        self.step_s.append(seconds / steps)
        self.steps += steps
        self.draft_tokens += draft_tokens

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)


def cost_ks(engine, method: str, quick: bool = False) -> list[int]:
    """The k values measured for a method: 1, 2, 4 and its fleet default (only the
    default with `quick`), deduplicated, within what the engine accepts; plain: 0."""
    if method == "plain":
        return [0]
    wanted = (_k(engine, method),) if quick else (*COST_KS, _k(engine, method))
    return sorted({k for k in wanted if 1 <= k <= engine.max_k})


def time_decode_steps(engine, requests: list[list[int]], method: str, k: int,
                      steps: int) -> tuple[float, float]:
    """Start the requests together (greedy, ignore_eos), step once past prefill, then time
    `steps` decode steps of all of them together: (seconds, draft tokens verified per
    sequence and step, summed over the steps). Prefill is never in the timed steps."""
    from workers.embedded.engine import SamplingParams

    params = SamplingParams(max_new_tokens=(steps + 2) * (k + 1) + 1, ignore_eos=True)
    gens = [engine.start(ids, params, method, k) for ids in requests]
    while not all(g.stats.verify_steps for g in gens):  # prefill (maybe chunked) + 1st token
        _check(engine.step([g for g in gens if not g.stats.verify_steps]))
    started = time.perf_counter()
    for _ in range(steps):
        _check(engine.step(gens))
    seconds = time.perf_counter() - started
    if any(g.finished or g.stats.batch_steps != steps for g in gens):
        raise RuntimeError(f"{method} k={k}: a request finished or skipped a timed step")
    draft = gens[0].stats.batch_draft_tokens / len(gens)  # every forward's drafts / batch
    for g in gens:
        g.cancel()
    return seconds, draft


def _check(outputs: list) -> None:
    for out in outputs:
        if isinstance(out, Exception):
            raise out


def measure_costs(engine, methods: list[str], rounds: int, steps: int, seed: int,
                  batches: tuple[int, ...] = COST_BATCHES, quick: bool = False,
                  progress: bool = False) -> dict[CostKey, CostTally]:
    """Every (method, k, batch) setting once per round, the order rotating each round so
    machine noise hits every setting alike."""
    ids = [engine.tokenizer.encode_chat(list(p.messages))
           for p in prompts("chat", max(batches), seed)]
    settings = [(m, k, b) for m in methods for k in cost_ks(engine, m, quick) for b in batches]
    tallies: dict[CostKey, CostTally] = {s: CostTally() for s in settings}
    started, done, total = time.monotonic(), 0, rounds * len(settings)
    for r in range(rounds):
        shift = (r * len(settings)) // max(rounds, 1)
        for method, k, batch in settings[shift:] + settings[:shift]:
            seconds, draft = time_decode_steps(engine, ids[:batch], method, k, steps)
            tallies[(method, k, batch)].add(seconds, steps, draft)
            done += 1
            if progress and (done % 10 == 0 or done == total):
                spent = time.monotonic() - started
                print(f"[bench batching] {done}/{total} settings, {spent:.0f}s, "
                      f"ETA {spent / done * (total - done):.0f}s", file=sys.stderr, flush=True)
    return tallies


def estimate_seconds(engine, methods: list[str], rounds: int, steps: int, seed: int,
                     batches: tuple[int, ...] = COST_BATCHES, quick: bool = False) -> float:
    """A rough run time: each method's step at its largest k and the largest batch,
    timed over 2 decode steps (this also warms every method up), for every setting."""
    ids = [engine.tokenizer.encode_chat(list(p.messages))
           for p in prompts("chat", max(batches), seed)]
    total = 0.0
    for method in methods:
        ks = cost_ks(engine, method, quick)
        seconds, _ = time_decode_steps(engine, ids[:max(batches)], method, max(ks), 2)
        # a step at batch b costs somewhere between the largest one's and less; prefill
        # and start-up add about one step per setting
        total += seconds / 2 * (steps + 2) * len(ks) * len(batches) * 0.7
    return total * rounds


def cost_rows(tallies: dict[CostKey, CostTally]) -> list[dict]:
    """The `costs` list of measured.json (policies/prior.py MeasuredCost): median over
    rounds of the mean seconds per decode step, steps summed over rounds; `draft_tokens`
    (not read by the policy) is what each sequence verified per step, which falls short
    of k when the drafter finds nothing to propose (ngram, lookahead)."""
    return [{"method": m, "k": k, "batch": b, "step_s": round(t.median_s, 6), "steps": t.steps,
             "draft_tokens": round(t.draft_tokens / t.steps, 2)}
            for (m, k, b), t in tallies.items()]


def format_costs(tallies: dict[CostKey, CostTally]) -> str:
    """method x k rows, per batch: ms per decode step (median over rounds) and relative to
    plain at the same batch; `draft` is the draft tokens each sequence verified per step."""
    batches = sorted({b for _, _, b in tallies})
    plain = {b: tallies[("plain", 0, b)].median_s for b in batches if ("plain", 0, b) in tallies}
    head = "| method | k | draft/seq | " + " | ".join(
        f"batch {b}: ms/step | vs plain" for b in batches) + " |"
    lines = [head, "|---|---|---|" + "---|---|" * len(batches)]
    for method, k in dict.fromkeys((m, k) for m, k, _ in tallies):
        row = [method, str(k)]
        drafts = [t.draft_tokens / t.steps for (m, kk, _), t in tallies.items()
                  if (m, kk) == (method, k)]
        row.append(f"{statistics.fmean(drafts):.1f}")
        for b in batches:
            tally = tallies.get((method, k, b))
            if tally is None:
                row += ["-", "-"]
                continue
            ratio = f"{tally.median_s / plain[b]:.2f}x" if b in plain else "-"
            row += [f"{tally.median_s * 1000:.1f}", ratio]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_costs(path: Path, rows: list[dict], source: str) -> dict:
    """Replace `costs` in the measured.json at `path` (every other key kept as it is),
    note the command in `costs_source`, and check the result parses as the policy reads
    it before writing."""
    from policies.prior import Measured

    document = json.loads(path.read_text())
    document["costs"] = rows
    document["costs_source"] = source
    Measured.from_dict(document)  # MeasuredError names the field
    path.write_text(json.dumps(document, indent=1) + "\n")
    return document


def _source(model: str, methods: list[str], rounds: int, steps: int, quick: bool) -> str:
    return (f"specroute bench batching --model {model} --methods {','.join(methods)} "
            f"--rounds {rounds} --steps {steps}" + (" --quick" if quick else ""))


def main(args: argparse.Namespace) -> int:
    import torch

    choice = resolve_model(getattr(args, "model", None))
    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "2")))
    engine = _load_engine(choice)
    wanted = args.methods.split(",") if getattr(args, "methods", None) else list(engine.methods)
    methods = ["plain", *[m for m in wanted if m != "plain"]]
    quick = getattr(args, "quick", False)
    seed = getattr(args, "seed", 0)
    dtype = str(engine.model.lm_head.weight.dtype).removeprefix("torch.")
    threads = torch.get_num_threads()
    rounds = getattr(args, "rounds", None) or (1 if quick else 2)
    steps = getattr(args, "steps", None) or (4 if quick else 24)
    batches = (1, 2) if quick else COST_BATCHES
    eta = estimate_seconds(engine, methods, rounds, steps, seed, batches, quick)
    print(f"[bench batching] step costs: {sum(len(cost_ks(engine, m, quick)) for m in methods)}"
          f" (method, k) x {len(batches)} batches x {rounds} rounds x {steps} steps, "
          f"estimated {eta / 60:.1f} min", file=sys.stderr, flush=True)
    tallies = measure_costs(engine, methods, rounds, steps, seed, batches, quick, progress=True)
    print(f"step costs: {choice.name}, {dtype}, {threads} threads, {rounds} interleaved "
          f"rounds x {steps} decode steps per setting (prefill not timed), chat prompts, "
          "greedy, ignore_eos")
    print("ms per decode step of `batch` sequences stepped together (median over rounds), "
          "and relative to plain at the same batch; draft/seq: draft tokens each sequence "
          "verified per step")
    print(format_costs(tallies))
    if getattr(args, "write_costs", None):
        source = _source(choice.name, methods, rounds, steps, quick)
        write_costs(Path(args.write_costs), cost_rows(tallies), source)
        print(f"wrote costs into {args.write_costs}")
    if getattr(args, "throughput", False):
        _throughput(engine, methods, rounds, getattr(args, "max_tokens", 48), quick, seed,
                    choice.name, dtype)
    return 0


def _throughput(engine, methods: list[str], rounds: int, max_tokens: int, quick: bool,
                seed: int, model: str, dtype: str) -> None:
    import torch

    max_tokens = 16 if quick else max_tokens
    run_together(engine, _prompt_ids(engine, 2, seed), "plain", 4, seed)  # warm-up
    rates = measure(engine, methods, rounds, max_tokens, seed)
    print(f"\nbatching benchmark: {model}, {dtype}, {torch.get_num_threads()} threads, "
          f"{rounds} interleaved rounds, {max_tokens} tokens per request, temperature 0")
    print(format_report(rates, methods))
