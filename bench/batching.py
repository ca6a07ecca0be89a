"""Batched decoding in the embedded engine: aggregate tokens/s as concurrency grows.

Drives the engine in-process the way the worker's scheduler does: N requests started
together, every step one `Engine.step` over all unfinished ones (one batched target
forward). Aggregate tokens/s = all completion tokens / wall time, prefill included.
Plain decoding at concurrency 1, 2 and 4 shows what batching buys (a decode step's cost
is mostly reading the weights, shared by the batch); every method at concurrency 1 and 4
shows speculation's margin shrinking with load, since at 4 a verify step over k + 1
tokens per request is no longer nearly free. Rounds interleave the settings so machine
noise hits them alike; figures are medians with their range over rounds.

    python -c "import sys, argparse; from bench.batching import main; \\
        sys.exit(main(argparse.Namespace(model='tiny', rounds=3, max_tokens=48, quick=False)))"
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench.engine import _k, _load_engine
from bench.workload import TASKS, prompts
from policies.fleet import resolve_model

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
    """Aggregate tokens/s per (method, concurrency), one figure per round."""
    ids = _prompt_ids(engine, max(CONCURRENCY), seed)
    settings = [("plain", c) for c in CONCURRENCY]
    settings += [(m, c) for m in methods if m != "plain" for c in (1, max(CONCURRENCY))]
    rates: dict[tuple[str, int], list[float]] = {s: [] for s in settings}
    for r in range(rounds):
        shift = r % len(settings)
        for method, concurrency in settings[shift:] + settings[:shift]:
            tokens, seconds, _ = run_together(engine, ids[:concurrency], method, max_tokens,
                                              seed + 100 * r)
            rates[(method, concurrency)].append(tokens / seconds)
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


def main(args: argparse.Namespace) -> int:
    import torch

    choice = resolve_model(getattr(args, "model", None))
    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "2")))
    engine = _load_engine(choice)
    wanted = args.methods.split(",") if getattr(args, "methods", None) else list(engine.methods)
    methods = ["plain", *[m for m in wanted if m != "plain"]]
    quick = getattr(args, "quick", False)
    rounds = getattr(args, "rounds", None) or (1 if quick else 3)
    max_tokens = 16 if quick else getattr(args, "max_tokens", 48)
    seed = getattr(args, "seed", 0)
    run_together(engine, _prompt_ids(engine, 2, seed), "plain", 4, seed)  # warm-up
    rates = measure(engine, methods, rounds, max_tokens, seed)
    dtype = str(engine.model.lm_head.weight.dtype).removeprefix("torch.")
    print(f"batching benchmark: {choice.name}, {dtype}, {torch.get_num_threads()} threads, "
          f"{rounds} interleaved rounds, {max_tokens} tokens per request, temperature 0")
    print(format_report(rates, methods))
    return 0
