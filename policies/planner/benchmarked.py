"""The launch benchmark the fleet planner reads (`Benchmarked` per (method, k)), built from
what workers measured about themselves: their `measured.json` documents
(policies/prior.py `Measured`), which a deployment has in the workers' registry entries
or `/server_info` (gateway/upstream/worker_priors.py).

Per (method, k) that some entry measured:
- accept length per class (task, temperature bucket): the entries at that (method, k),
  mean weighted by requests (several documents: their entries pooled);
- step seconds per batch: the `costs` measured at that (method, k) (`specroute bench
  batching`), mean weighted by steps; at a k the costs did not run but bracket, linear in
  k between the nearest k measured at that batch. Without costs: the entries' step,
  accept length / tokens/s (`specroute bench engine` runs one request at a time: batch
  1), which the planner then takes as the step at every batch;
- plain: its costs, else its entries, else from the speculative entries' speedup over
  plain in the same run (plain's step = speedup / tokens/s).
A (method, k) no entry measured is left out: nothing says how many tokens it accepts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from policies.planner.launch import Benchmarked, Class, Config
from policies.planner.plan import PoolSlot
from policies.prior import Measured, MeasuredCost, MeasuredEntry
from policies.types import temperature_bucket


def benchmarked_from_measured(documents: Iterable[Measured]) -> tuple[Benchmarked, ...]:
    """Every (method, k) the documents' entries measured, with its step per batch."""
    docs = list(documents)
    entries = [e for d in docs for e in d.entries]
    costs = [c for d in docs for c in d.costs]
    configs = {_config(e.method, e.k) for e in entries if e.method == "plain" or e.k > 0}
    if entries:
        configs.add(("plain", 0))
    out = []
    for method, k in sorted(configs):
        steps = _cost_steps(costs, (method, k)) or _entry_steps(entries, (method, k))
        if not steps and method == "plain":
            steps = _plain_from_speedup(entries)
        if steps:
            batches = tuple(sorted(steps))
            out.append(Benchmarked(method, k, _lengths(entries, (method, k)) if k > 0 else {},
                                   batches, tuple(steps[b] for b in batches)))
    return tuple(out)


def unmeasured(bench: Iterable[Benchmarked], pools: Iterable[PoolSlot]) -> list[str]:
    """The pools whose (method, k) the benchmark has no figures for."""
    have = {(b.method, b.k) for b in bench}
    return sorted(p.name for p in pools if _config(p.method, p.k) not in have)


def _config(method: str, k: int) -> Config:
    return ("plain", 0) if method == "plain" or k <= 0 else (method, k)


def _mean(pairs: Iterable[tuple[float, float]]) -> float | None:
    """Weighted mean of (value, weight) pairs; None without weight."""
    total = weight = 0.0
    for value, w in pairs:
        total += value * w
        weight += w
    return total / weight if weight > 0 else None


def _lengths(entries: list[MeasuredEntry], config: Config) -> dict[Class, float]:
    by_class: dict[Class, list[tuple[float, float]]] = defaultdict(list)
    for e in entries:
        if _config(e.method, e.k) == config:
            by_class[(e.task, temperature_bucket(e.temperature))].append(
                (e.accept_length, max(e.requests, 1)))
    return {cls: mean for cls, pairs in by_class.items()
            if (mean := _mean(pairs)) is not None}


def _cost_steps(costs: list[MeasuredCost], config: Config) -> dict[int, float]:
    """Step seconds per batch at `config`, interpolated in k where the costs bracket it."""
    method, k = config
    at: dict[int, dict[int, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for c in costs:
        cm, ck = _config(c.method, c.k)
        if cm == method:
            at[c.batch][ck].append((c.step_s, c.steps))
    out = {}
    for batch, by_k in at.items():
        means = {kk: m for kk, pairs in by_k.items() if (m := _mean(pairs)) is not None}
        lower = [kk for kk in means if kk <= k]
        upper = [kk for kk in means if kk >= k]
        if not lower or not upper:
            continue
        lo, hi = max(lower), min(upper)
        w = 0.0 if hi == lo else (k - lo) / (hi - lo)
        out[batch] = means[lo] + w * (means[hi] - means[lo])
    return out


def _entry_steps(entries: list[MeasuredEntry], config: Config) -> dict[int, float]:
    step = _mean((e.accept_length / e.tokens_per_s, max(e.requests, 1)) for e in entries
                 if _config(e.method, e.k) == config and e.tokens_per_s > 0)
    return {1: step} if step is not None else {}


def _plain_from_speedup(entries: list[MeasuredEntry]) -> dict[int, float]:
    step = _mean((e.speedup / e.tokens_per_s, max(e.requests, 1)) for e in entries
                 if e.tokens_per_s > 0 and e.speedup > 0)
    return {1: step} if step is not None else {}
