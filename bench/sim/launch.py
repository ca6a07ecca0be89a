"""The launch benchmark in the world, and the fleet launched from it (policies/planner/
launch.py): the shipped strategy for fixed-k fleets.

Before serving, the operator benchmarks every (method, k) the fleet's engine may run, as
one would with `specroute bench engine` and `specroute bench batching` on one server per
configuration: accept length per class (task x greedy / T 1) on `PROMPTS` held-out
prompts of `TOKENS` tokens each (their own per-prompt draws, sampled verify steps), and
step time at batches 1-64 all at that k with `TIMING_NOISE` of timing error
(bench/sim/measure.py's benchmark). Never the world's expected values. The plan weighs
the classes by a mix: the observed one (`observed_mix`: the classifier's labels over the
traffic, what the gateway's logs give an operator who relaunches), or an even mix where
nothing is known of the traffic yet (`even_mix`, what the shipped strategy launches
from: at edit share 0 it still gives n-gram two workers that sit idle; the observed mix
gives two to plain instead, for sampled chat, and measures no better: docs/POLICY.md);
`BATCH` requests per worker. The learned policy then routes over the launched pools and
relaunches a pool at its desired k as on any fixed-k fleet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from bench.sim.calibration import PAPER_K, PAPER_TREE_DEPTH, TASKS
from bench.sim.engine_fleet import SGLANG_ADAPTIVE
from bench.sim.measure import BENCH_BATCHES, _accept_length, _step
from bench.sim.scenarios import FLEET_WORKERS, Scenario
from bench.sim.types import SimPool, SimRequest
from bench.sim.world import World
from policies.planner.launch import Benchmarked, LaunchPlan, plan_launch
from policies.prior import Measured, MeasuredEntry, WorkerPrior
from policies.types import temperature_bucket

PROMPTS = 16
TOKENS = 256
TEMPERATURES = (0.0, 1.0)
LAUNCH_KS = (1, 2, 3, 4, 6, 8, 12)
BATCH = 8.0


def _configs(scenario: Scenario) -> list[tuple[SimPool, int]]:
    """(a pool spec of the method, k) for every configuration the engine may launch."""
    out: list[tuple[SimPool, int]] = []
    seen = set()
    for spec in scenario.fleet:
        if spec.method in seen:
            continue
        seen.add(spec.method)
        if spec.method == "plain":
            out.append((spec, 0))
            continue
        top = max(s.max_k for s in scenario.fleet if s.method == spec.method)
        for k in LAUNCH_KS:
            if k <= top and (spec.method not in PAPER_TREE_DEPTH or k <= PAPER_K[spec.method]):
                out.append((spec, k))
    if not any(k == 0 for _, k in out):
        base = scenario.fleet[0]
        out.append((replace(base, name="plain", method="plain", k=0), 0))
    return out


def launch_bench(scenario: Scenario, world: World, seed: int,
                 base_step_s: float = 0.015) -> list[Benchmarked]:
    out = []
    for i, (spec, k) in enumerate(_configs(scenario)):
        rng = np.random.default_rng([seed, 9002, i])  # apart from traffic and the prior
        at_k = replace(spec, k=k)
        lengths = {}
        for task in TASKS:
            for temperature in TEMPERATURES:
                cls = (task, temperature_bucket(temperature))
                lengths[cls] = (1.0 if k == 0 else _accept_length(
                    rng, world, at_k, [task] * PROMPTS, [temperature] * PROMPTS, TOKENS))
        steps = tuple(_step(rng, world, at_k, b, k, base_step_s) for b in BENCH_BATCHES)
        out.append(Benchmarked(spec.method, k, lengths, BENCH_BATCHES, steps))
    return out


Mix = Mapping[tuple[str, str], float]  # (task, temperature bucket) -> share of requests


def benchmark(scenario: Scenario, world: World, seed: int, base_step_s: float = 0.015
              ) -> list[Benchmarked]:
    """`launch_bench`, once per (scenario, world, seed, base step)."""
    key = (scenario.name, world, seed, base_step_s)
    if key not in _BENCH:
        _BENCH[key] = launch_bench(scenario, world, seed, base_step_s)
    return _BENCH[key]


def tuned_tiers(bench: list[Benchmarked], method: str, mix: Mix | None = None,
                tiers: dict = SGLANG_ADAPTIVE) -> dict:
    """SGLang's adaptive tiers (batch keys and hysteresis kept) with the candidate steps
    an operator reads off the same benchmark the launch plan gets: per tier, the k of
    `method` (or 0, plain) of the most tokens/s over `mix` (None: even) at the tier's
    batch, and its neighbours among the benchmarked k, so the EMA still moves."""
    demand = dict(mix) if mix is not None else even_mix()
    configs = [b for b in bench if b.method == method or b.k == 0]
    ks = sorted({b.k for b in configs})
    out = {}
    for key, (_, up, down) in tiers.items():
        best = max(configs, key=lambda b: (sum(share * b.tokens_per_s(cls, key)
                                               for cls, share in demand.items()), -b.k))
        i = ks.index(best.k)
        out[key] = (tuple(ks[max(i - 1, 0):i + 2]), up, down)
    return out


def favoured_k(bench: list[Benchmarked], method: str, batch: float, mix: Mix | None = None,
               plain: bool = True) -> int:
    """The k of `method` (0: plain, when `plain`) of the most tokens/s over `mix` (None:
    even) at `batch` requests per worker in the benchmark; ties to the smaller k."""
    demand = dict(mix) if mix is not None else even_mix()
    configs = [b for b in bench if b.method == method or (plain and b.k == 0)]
    return max(configs, key=lambda b: (sum(share * b.tokens_per_s(cls, batch)
                                           for cls, share in demand.items()), -b.k)).k


def tuned_schedule(bench: list[Benchmarked], method: str, mix: Mix | None = None,
                   top: int = 1024) -> tuple[tuple[int, int, int], ...]:
    """vLLM's `num_speculative_tokens_per_batch_size` read off the same benchmark: from
    each benchmarked batch to the next one's predecessor (the last to `top`), the
    `favoured_k` there; equal neighbours merged. (vLLM's table needs k > 0 per range;
    a 0 here means plain, which the simulated engine runs as no drafts.)"""
    batches = sorted({b for c in bench for b in c.batches})
    ranges: list[tuple[int, int, int]] = []
    for i, batch in enumerate(batches):
        last = batches[i + 1] - 1 if i + 1 < len(batches) else top
        k = favoured_k(bench, method, batch, mix)
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], last, k)
        else:
            ranges.append((1 if not ranges else batch, last, k))
    return tuple(ranges)


def table_method(bench: list[Benchmarked], mix: Mix | None = None, batch: float = BATCH
                 ) -> str:
    """The method a vLLM operator tuning a batch table from the benchmark would run: the
    one whose best k gives the most tokens/s over `mix` at `batch` (a table sets k, the
    method is the server's; vLLM's table takes any method)."""
    demand = dict(mix) if mix is not None else even_mix()
    best = max((b for b in bench if b.k > 0),
               key=lambda b: sum(share * b.tokens_per_s(cls, batch)
                                 for cls, share in demand.items()))
    return best.method


def verification_k(bench: list[Benchmarked], method: str, mix: Mix | None = None,
                   batch: float = BATCH) -> int:
    """`num_speculative_tokens` for vLLM's adaptive verification, read off the benchmark:
    the k of `method` it favours at the launch plan's `BATCH` requests per worker.
    Adaptive verification trims what is verified, not what is drafted (every request
    drafts all k, at the drafter's cost), so a deeper k only pays where verifying is
    what costs; the largest k any batch favours measured worse (docs/POLICY.md)."""
    return favoured_k(bench, method, batch, mix, plain=False)


def even_mix() -> dict[tuple[str, str], float]:
    return {(task, temperature_bucket(t)): 1.0 for task in TASKS for t in TEMPERATURES}


def observed_mix(requests: list[SimRequest]) -> dict[tuple[str, str], float]:
    """Each (label, bucket)'s share of `requests`: what the classifier logged."""
    counts = Counter((r.seen_task, r.bucket) for r in requests)
    return {cls: n / len(requests) for cls, n in sorted(counts.items())}


def launched(scenario: Scenario, world: World, seed: int, batch: float = BATCH,
             base_step_s: float = 0.015, model: str = "base", mix: Mix | None = None
             ) -> tuple[Scenario, LaunchPlan, dict[str, WorkerPrior]]:
    """The scenario with its fleet replaced by the launch plan's pools for `mix` (None:
    even), and the pools' prior: the benchmark's accept length per class at the pool's k
    (what the operator measured and planned from; a server's own average is one figure
    for every class)."""
    demand = dict(mix) if mix is not None else even_mix()
    key = (scenario.name, world, seed, batch, base_step_s, model, tuple(sorted(demand.items())))
    if key in _LAUNCHED:
        return _LAUNCHED[key]
    bench = benchmark(scenario, world, seed, base_step_s)
    plan = plan_launch(bench, demand, FLEET_WORKERS, batch)
    specs = {s.method: s for s in scenario.fleet}
    fleet = []
    for pool in plan.pools:
        spec = specs.get(pool.method, scenario.fleet[0])
        top = max((s.max_k for s in scenario.fleet if s.method == pool.method),
                  default=pool.k)
        fleet.append(SimPool(pool.name, spec.engine, pool.method, pool.k, False,
                             pool.workers, max(top, pool.k),
                             scenario.curves.get(pool.method, spec.curve),
                             group=pool.name, law=scenario.law))
    notes = f"launched from the benchmark: {plan.describe()}"
    out = (replace(scenario, name=f"{scenario.name}-launched", fleet=tuple(fleet),
                   notes=notes), plan,
           pool_priors(bench, [(p.name, p.method, p.k) for p in plan.pools], model,
                       base_step_s))
    _LAUNCHED[key] = out
    return out


_LAUNCHED: dict[tuple, tuple[Scenario, LaunchPlan, dict[str, WorkerPrior]]] = {}
_BENCH: dict[tuple, list[Benchmarked]] = {}


def pool_priors(bench: list[Benchmarked], pools: list[tuple[str, str, int]], model: str,
                base_step_s: float) -> dict[str, WorkerPrior]:
    """Per pool (name, method, k): the benchmark's accept length per class at its k as
    the prior its workers publish."""
    by_config = {(b.method, b.k): b for b in bench}
    plain = by_config.get(("plain", 0))
    out = {}
    for name, method, k in pools:
        if method == "plain" or k <= 0:
            continue
        b = by_config[(method, k)]
        plain_s = plain.step_s[0] if plain is not None else base_step_s
        entries = tuple(
            MeasuredEntry(method, k, task, 0.0 if bucket == "t0" else 1.0, length,
                          length / b.step_s[0], length * plain_s / b.step_s[0], PROMPTS)
            for (task, bucket), length in b.accept_length.items())
        out[name] = WorkerPrior.from_measured(
            model, method, Measured(model, "launch benchmark", "", "simulated", entries))
    return out
