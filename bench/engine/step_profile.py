"""`specroute bench step`: where one decode step of the embedded engine spends its time.

One request (a code prompt, greedy) per method, a few warm-up steps, then `--steps` steps
under `torch.profiler` (CPU activities); prints, per method, wall ms per step, the drafts
accepted, and the operators by self CPU time with their calls per step and share. The
profiler's own cost inflates ms per step (~10-20% here): compare shares, and take tokens/s
from `specroute bench engine`.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass

from bench.engine.methods import _load_engine, variant
from workers.models import resolve_model

PROMPT = "Write a Python function that checks whether a number is prime."


@dataclass(frozen=True)
class OpShare:
    name: str
    calls_per_step: float
    share: float  # of the profiled self CPU time


@dataclass(frozen=True)
class StepProfile:
    label: str
    steps: int
    ms_per_step: float
    tokens: int
    proposed_drafts: int
    correct_drafts: int
    ops: list[OpShare]


def profile_method(engine, label: str, steps: int, warmup: int = 4,
                   top: int = 8) -> StepProfile:
    """Profile `steps` decode steps of one greedy request on method `label` (method[:k])."""
    from torch.profiler import ProfilerActivity, profile

    from workers.embedded.engine import SamplingParams

    method, k = variant(label, engine.max_k)
    ids = engine.tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    params = SamplingParams(max_new_tokens=(warmup + steps) * (k + 1) + 1, temperature=0.0,
                            ignore_eos=True)
    gen = engine.start(ids, params, method=method, k=k)
    for _ in range(warmup):
        gen.step()
    before = (len(gen.output_ids), gen.stats.num_proposed_drafts, gen.stats.num_correct_drafts)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            gen.step()
    seconds = time.perf_counter() - t0
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    ops = [OpShare(e.key, e.count / steps, e.self_cpu_time_total / total) for e in events[:top]]
    return StepProfile(label=label, steps=steps, ms_per_step=seconds / steps * 1000,
                       tokens=len(gen.output_ids) - before[0],
                       proposed_drafts=gen.stats.num_proposed_drafts - before[1],
                       correct_drafts=gen.stats.num_correct_drafts - before[2], ops=ops)


def format_profile(result: StepProfile) -> str:
    lines = [f"{result.label}: {result.ms_per_step:.1f} ms/step (profiled), {result.tokens} "
             f"tokens in {result.steps} steps, {result.correct_drafts}/"
             f"{result.proposed_drafts} drafts accepted",
             "| op | calls a step | self CPU share |", "|---|---|---|"]
    lines += [f"| `{op.name}` | {op.calls_per_step:g} | {op.share:.0%} |" for op in result.ops]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(int(os.environ.get("SPECROUTE_BENCH_THREADS", "1")))
    engine = _load_engine(resolve_model(args.model))
    labels = args.methods.split(",") if args.methods else ["plain", "eagle", "medusa"]
    steps = args.steps or (4 if args.quick else 20)
    results = [profile_method(engine, label, steps) for label in labels]
    print(f"decode-step profile, {torch.get_num_threads()} thread(s), one greedy request")
    print("\n\n".join(format_profile(r) for r in results))
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
    return 0
