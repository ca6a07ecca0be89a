"""The workers' prior as the workers would get it: a measurement run in the world.

Before serving, each speculative pool measures itself on a sample of prompts held apart
from the traffic (their own random draws: per-prompt acceptance, verify steps, timing
noise), never from the world's expected values:

- SGLang and vLLM servers: one average accept length over what they served
  (`avg_spec_accept_length`), here `SERVER_PROMPTS` prompts of a mixed sample (every
  class, greedy and T 1), 256 tokens each — one figure for every class, the mix's;
- embedded workers: their engine benchmark (`specroute bench engine --write-measured`:
  `BENCH_PROMPTS` prompts per task at T 0 and 0.8, 48 tokens, as docs/results/
  2026-12-01-engine.md ran it) — accept length per (task, temperature) at the pool's k
  and its speedup over plain at batch 1 — and their batch benchmark (`specroute bench
  batching --write-costs`: step time of 1-64 sequences all at k 1, 2, 4 and the pool's
  k), each figure with `TIMING_NOISE` (a lognormal's sigma) of timing error.

Measured on the base target: the fine-tuned phase's drop is for telemetry to find.
"""

from __future__ import annotations

import numpy as np

from bench.sim.calibration import TASKS
from bench.sim.scenarios import Scenario
from bench.sim.simulator import uniform_step_s
from bench.sim.steplaw import drafting_cost, law
from bench.sim.types import SimPool
from bench.sim.world import World, sample_steps
from policies.prior import Measured, MeasuredCost, MeasuredEntry, WorkerPrior
from policies.types import temperature_bucket

SERVER_PROMPTS = 24
SERVER_TOKENS = 256
BENCH_PROMPTS = 8
BENCH_TOKENS = 48
BENCH_TEMPERATURES = (0.0, 0.8)
BENCH_BATCHES = (1, 2, 4, 8, 16, 32, 64)
BENCH_KS = (1, 2, 4)
TIMING_NOISE = 0.03


def _accept_length(rng: np.random.Generator, world: World, spec: SimPool,
                   tasks: list[str], temperatures: list[float], tokens: int) -> float:
    """Tokens per verify step over a sample of prompts served at the pool's k."""
    z = world.family_draws(rng, len(tasks))
    depth, decay = world.depth(spec.method, spec.k), world.decay(spec.method)
    steps = 0
    for task, temperature, (zm, zt) in zip(tasks, temperatures, z, strict=True):
        a = world.prompt_accept(spec.method, task, temperature_bucket(temperature), zm, zt)
        steps += sample_steps(rng, a, decay, depth, tokens)
    return len(tasks) * tokens / steps


def _step(rng: np.random.Generator, world: World, spec: SimPool, b: int, k: int,
          base_step_s: float) -> float:
    step_law = law(spec.law) if world.measured_steps and spec.law else None
    draft = drafting_cost(step_law, spec.method, world.depth(spec.method, k) if k > 0 else 0)
    exact = uniform_step_s(base_step_s, spec.curve, b, k, draft, step_law, spec.method)
    return exact * float(rng.lognormal(0.0, TIMING_NOISE))


def _engine_bench(rng: np.random.Generator, world: World, spec: SimPool, model: str,
                  base_step_s: float) -> Measured:
    entries = []
    for task in TASKS:
        for temperature in BENCH_TEMPERATURES:
            length = _accept_length(rng, world, spec, [task] * BENCH_PROMPTS,
                                    [temperature] * BENCH_PROMPTS, BENCH_TOKENS)
            ratio = (_step(rng, world, spec, 1, spec.k, base_step_s)
                     / _step(rng, world, spec, 1, 0, base_step_s))
            entries.append(MeasuredEntry(spec.method, spec.k, task, temperature, length,
                                         length / (base_step_s * ratio), length / ratio,
                                         BENCH_PROMPTS))
    costs = [MeasuredCost("plain", 0, b, _step(rng, world, spec, b, 0, base_step_s), 64)
             for b in BENCH_BATCHES]
    costs += [MeasuredCost(spec.method, k, b, _step(rng, world, spec, b, k, base_step_s), 64)
              for k in sorted({*BENCH_KS, spec.k}) for b in BENCH_BATCHES]
    return Measured(model, "simulated engine and batch bench", "", "simulated",
                    tuple(entries), tuple(costs))


def measured_priors(scenario: Scenario, world: World, model: str, seed: int,
                    base_step_s: float = 0.015) -> dict[str, WorkerPrior]:
    """What each speculative pool's workers publish after measuring themselves."""
    out = {}
    for i, spec in enumerate(scenario.fleet):
        if spec.method == "plain" or spec.k <= 0:
            continue
        rng = np.random.default_rng([seed, 9001, i])  # apart from the traffic's draws
        if spec.engine == "embedded":
            out[spec.name] = WorkerPrior.from_measured(
                model, spec.method, _engine_bench(rng, world, spec, model, base_step_s))
            continue
        tasks = [TASKS[j % len(TASKS)] for j in range(SERVER_PROMPTS)]
        temperatures = [0.0 if j % 2 == 0 else 1.0 for j in range(SERVER_PROMPTS)]
        length = _accept_length(rng, world, spec, tasks, temperatures, SERVER_TOKENS)
        out[spec.name] = WorkerPrior.from_server_average(model, spec.method, length, spec.k)
    return out
