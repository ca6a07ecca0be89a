"""The launch plan of a fixed-k fleet from a benchmark of every (method, k) it may run.

SGLang and vLLM fix method and k per server at launch, so the fleet's composition is
chosen before any traffic and routing can only choose among the pools that exist. A
fleet launched as a per-method split at guessed k leaves most workers on configurations
no class wants: in the simulator the static split at its launch k reaches 0.49 of the
best homogeneous fleet even with a per-class oracle routing it (docs/POLICY.md,
"Why fixed-k fleets lost"). The policy's own model cannot pick the k either: its chain
law E(a, k) extrapolated from one measured k and its cost fit, linear in k at a load,
under-predict deep drafting where accepted runs continue and the step saturates
(the fleet planner from the priors launched EAGLE-3 k 4, the benchmark's best is k 12).

So the launch plan reads measurements, never extrapolates: for every (method, k) the
operator benchmarked, the accept length per class (task, temperature bucket) on held-out
prompts, and the step time at each batch size (`specroute bench batching`-style). Each
class's tokens/s at a batch `b` per worker is accept length / step(b), interpolated in
`b` between measured batches. The plan:

1. per class, the best configuration at the operating batch (`batch`, requests per
   worker the operator expects);
2. a configuration that is some class's best but beats the best single configuration
   for that class by less than `split_margin` is folded into it: a split must pay for
   smaller pools (fewer batch-mates to share the fixed cost) and misclassified requests;
3. workers per configuration in proportion to its classes' demand in verify steps
   (share x output tokens / accept length), at least one each, largest remainder.

The result is a list of pools (name, method, k, workers); one pool when one configuration
is best for every class — the best homogeneous fleet, found from measurement.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass

Class = tuple[str, str]  # (task, temperature bucket)
Config = tuple[str, int]  # (method, k); ("plain", 0)


@dataclass(frozen=True, slots=True)
class Benchmarked:
    """One configuration's measurements: accept length per class, step seconds per batch."""

    method: str
    k: int
    accept_length: Mapping[Class, float]
    batches: tuple[int, ...]
    step_s: tuple[float, ...]

    def step_at(self, batch: float) -> float:
        """Step seconds at `batch` per worker: linear between measured batches, the
        nearest measured one outside them."""
        i = bisect.bisect_left(self.batches, batch)
        if i <= 0:
            return self.step_s[0]
        if i >= len(self.batches):
            return self.step_s[-1]
        lo, hi = self.batches[i - 1], self.batches[i]
        w = (batch - lo) / (hi - lo)
        return self.step_s[i - 1] + w * (self.step_s[i] - self.step_s[i - 1])

    def tokens_per_s(self, cls: Class, batch: float) -> float:
        length = 1.0 if self.k <= 0 else self.accept_length.get(cls, 1.0)
        return length / self.step_at(batch)


@dataclass(frozen=True, slots=True)
class LaunchPool:
    name: str
    method: str
    k: int
    workers: int
    classes: tuple[Class, ...]  # the classes it was launched for


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    pools: tuple[LaunchPool, ...]
    best_single: Config  # the configuration best over the whole mix
    per_class: Mapping[Class, Config]  # each class's own best (before folding)

    def describe(self) -> str:
        return ", ".join(f"{p.name} x{p.workers}" for p in self.pools)


def plan_launch(bench: list[Benchmarked], demand: Mapping[Class, float], workers: int,
                batch: float = 8.0, split_margin: float = 0.10,
                output_tokens: float = 256.0) -> LaunchPlan:
    """Pools to launch for the class mix `demand` (class -> share of requests)."""
    if not bench or not demand:
        raise ValueError("a launch plan needs benchmarked configurations and a class mix")
    by_config = {(b.method, b.k): b for b in bench}
    total = sum(demand.values())

    def mix_value(config: Config) -> float:
        b = by_config[config]
        return sum(share * b.tokens_per_s(cls, batch) for cls, share in demand.items()) / total

    single = max(by_config, key=lambda c: (mix_value(c), -c[1]))
    per_class = {cls: max(by_config, key=lambda c: (by_config[c].tokens_per_s(cls, batch),
                                                    -c[1]))
                 for cls in demand}
    chosen: dict[Config, list[Class]] = {}
    for cls, config in per_class.items():
        own = by_config[config].tokens_per_s(cls, batch)
        fallback = by_config[single].tokens_per_s(cls, batch)
        target = config if own >= fallback * (1.0 + split_margin) else single
        chosen.setdefault(target, []).append(cls)
    configs = sorted(chosen, key=lambda c: (c != single, c))
    weights = []
    for config in configs:
        b = by_config[config]
        weights.append(sum(demand[cls] * output_tokens / max(b.accept_length.get(cls, 1.0)
                                                             if b.k > 0 else 1.0, 1.0)
                           for cls in chosen[config]))
    counts = apportion(weights, workers)
    pools = tuple(LaunchPool(f"{m}-k{k}" if m != "plain" else "plain", m, k, n,
                             tuple(sorted(chosen[(m, k)])))
                  for (m, k), n in zip(configs, counts, strict=True) if n > 0)
    return LaunchPlan(pools, single, per_class)


def candidate_configs(bench: list[Benchmarked], classes: list[Class],
                      batches: tuple[int, ...]) -> list[Config]:
    """The configurations a fleet planned from the benchmark may give workers: each
    class's best at each measured batch, the best over an even mix of `classes` at each,
    and plain (what soaks load when speculation stops paying). Every other configuration
    is beaten by one of these for every class at the batches measured, and leaving it out
    keeps the planner's search (quadratic in the pools) small."""
    by_config = {(b.method, b.k): b for b in bench}
    out: dict[Config, None] = {}
    for batch in batches:
        for cls in classes:
            out[max(by_config, key=lambda c: (by_config[c].tokens_per_s(cls, batch),
                                              -c[1]))] = None
        out[max(by_config, key=lambda c: (sum(by_config[c].tokens_per_s(cls, batch)
                                              for cls in classes), -c[1]))] = None
    if ("plain", 0) in by_config:
        out[("plain", 0)] = None
    return sorted(out)


def apportion(weights: list[float], total: int) -> list[int]:
    """Largest-remainder split of `total` by weight, at least one each while they last."""
    n = len(weights)
    if n == 0:
        return []
    if total <= n:
        order = sorted(range(n), key=lambda i: -weights[i])
        return [1 if i in order[:total] else 0 for i in range(n)]
    spare = total - n
    whole = sum(weights) or 1.0
    raw = [w / whole * spare for w in weights]
    counts = [1 + int(r) for r in raw]
    order = sorted(range(n), key=lambda i: -(raw[i] - int(raw[i])))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts
