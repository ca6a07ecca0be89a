"""`specroute bench engine`: every decoding method x request class x temperature, in one run.

Runs the embedded engine in-process on the bundled model (float32, the engine's CPU default:
faster than bf16 for a model this small and exact for greedy; 2 threads by default) and
prints accept length, tokens/s and speedup over plain decoding measured in the same run,
interleaved per prompt so that machine noise hits every method alike.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import defaultdict

from bench.workload import TASKS, prompts

TEMPERATURES = (0.0, 0.8)


def _run(engine, ids: list[int], method: str, temperature: float, max_tokens: int, seed: int):
    from workers.embedded.engine import SamplingParams

    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, seed=seed,
                            ignore_eos=True)
    t0 = time.perf_counter()
    gen = engine.start(ids, params, method=method)
    while not gen.finished:
        gen.step()
    return gen.stats, time.perf_counter() - t0


def measure(engine, methods: list[str], n_prompts: int, max_tokens: int, seed: int) -> list[dict]:
    from workers.embedded.chat_template import render_chat

    rows = []
    for task in TASKS:
        for temperature in TEMPERATURES:
            totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
            for i, prompt in enumerate(prompts(task, n_prompts, seed)):
                ids = engine.tokenizer.encode(render_chat(list(prompt.messages)))
                for method in methods:
                    stats, seconds = _run(engine, ids, method, temperature, max_tokens, seed + i)
                    tot = totals[method]
                    tot[0] += stats.completion_tokens
                    tot[1] += seconds
                    tot[2] += stats.verify_steps
            plain_rate = totals["plain"][0] / totals["plain"][1]
            for method in methods:
                tokens, seconds, steps = totals[method]
                rate = tokens / seconds
                rows.append({"method": method, "task": task, "temperature": temperature,
                             "accept_length": round(tokens / max(steps, 1), 2),
                             "tokens_per_s": round(rate, 1),
                             "speedup": round(rate / plain_rate, 2)})
    return rows


def format_table(rows: list[dict]) -> str:
    lines = ["| method | class | T | accept length | tokens/s | speedup vs plain |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['task']} | {r['temperature']:g} | {r['accept_length']:.2f} "
                     f"| {r['tokens_per_s']:.0f} | {r['speedup']:.2f}x |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import torch

    from workers.embedded.engine import Engine

    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "2")))
    engine = Engine()
    methods = ["plain", *[m for m in engine.methods if m != "plain"]]
    n_prompts, max_tokens = (1, 32) if args.quick else (4, 96)
    # Warm up every method once so lazy initialisation is not timed.
    warm = engine.tokenizer.encode("def f(x):\n    return x\n")
    for method in methods:
        _run(engine, warm, method, 0.0, 8, 0)
    rows = measure(engine, methods, n_prompts, max_tokens, args.seed)
    print(f"engine benchmark: bundled model, {str(engine.model.lm_head.weight.dtype)[6:]}, "
          f"{torch.get_num_threads()} threads, "
          f"{n_prompts} prompts x {max_tokens} tokens per cell")
    print(format_table(rows))
    if args.json:
        print(json.dumps({"rows": rows, "threads": torch.get_num_threads(),
                          "prompts_per_cell": n_prompts, "max_tokens": max_tokens}))
    return 0
