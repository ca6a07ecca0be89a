"""Speculation-aware sharding of a homogeneous adaptive fleet (strategy (a), docs/POLICY.md).

Every worker runs the same engine with its own batch-level adaptation (SGLang's
`--speculative-adaptive`: one EMA of accepted drafts per batch-size tier). Mixed traffic
puts easy and hard requests in one batch, so each engine adapts to the mix's mean
(SGLang #23705: "the batch EMA puts easy and hard requests on one tier"). The gateway
knows each request's class (the classifier's label and temperature bucket) and, from
what the engines report per request, each class's accept length; it sends classes of
similar accept length to the same workers, so each engine's adaptation fits its traffic.

- Classes are ranked by their mean accept length (decayed, `tau_s`), once
  `min_requests` have finished; unknown classes go to the least-loaded worker.
- The ranked classes are cut into at most `shards` groups of about equal demand
  (verify steps wanted: tokens / accept length); each group gets workers in proportion
  to its demand times `weight(accept length)` (`tilt` 0: demand only; 1: the
  high-acceptance groups get more workers per unit of demand, so their batches stay
  small enough for the engine's small-batch tier, which drafts deeper), at least one.
- Within a group, the least-loaded worker; re-cut every `rebalance_s`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bench.sim.types import SimRequest


@dataclass
class Sharder:
    workers: int
    shards: int = 3
    tilt: float = 0.0
    min_requests: float = 20.0
    rebalance_s: float = 5.0
    tau_s: float = 60.0
    _stats: dict = field(default_factory=dict)  # class -> [accept sum, n, tokens, t]
    _groups: dict = field(default_factory=dict)  # class -> worker indices
    _next: float = 0.0

    @staticmethod
    def context(req: SimRequest) -> tuple[str, str]:
        return req.seen_task, req.bucket

    def finished(self, req: SimRequest, accept_length: float, k: int) -> None:
        s = self._stats.setdefault(self.context(req), [0.0, 0.0, 0.0, req.arrival_s])
        fade = math.exp(-max(req.arrival_s - s[3], 0.0) / self.tau_s)
        s[0] = s[0] * fade + accept_length
        s[1] = s[1] * fade + 1.0
        s[2] = s[2] * fade + req.output_tokens
        s[3] = max(s[3], req.arrival_s)

    def _recut(self) -> None:
        known = [(s[0] / s[1], s[2] / s[1], s[1], ctx) for ctx, s in self._stats.items()
                 if s[1] >= self.min_requests]
        if len(known) < 2:
            self._groups = {}
            return
        known.sort()
        demand = [n * tokens / accept for accept, tokens, n, _ in known]
        total = sum(demand)
        groups: list[list[int]] = [[]]
        running = 0.0
        for i, d in enumerate(demand):
            if groups[-1] and running >= total * len(groups) / self.shards \
                    and len(groups) < self.shards:
                groups.append([])
            groups[-1].append(i)
            running += d
        weights = [sum(demand[i] for i in g)
                   * (sum(known[i][0] * demand[i] for i in g) / sum(demand[i] for i in g))
                   ** self.tilt for g in groups]
        counts = _apportion(weights, self.workers)
        start, self._groups = 0, {}
        for g, count in zip(groups, counts, strict=True):
            members = list(range(start, start + count))
            start += count
            for i in g:
                self._groups[known[i][3]] = members

    def dispatch(self, req: SimRequest, loads: list[int]) -> int:
        if req.arrival_s >= self._next:
            self._recut()
            self._next = req.arrival_s + self.rebalance_s
        members = self._groups.get(self.context(req)) or range(len(loads))
        return min(members, key=lambda i: loads[i])


def _apportion(weights: list[float], total: int) -> list[int]:
    """Largest-remainder split of `total` workers by weight, at least one each."""
    n = len(weights)
    spare = total - n
    raw = [w / sum(weights) * spare for w in weights]
    counts = [1 + int(r) for r in raw]
    order = sorted(range(n), key=lambda i: -(raw[i] - int(raw[i])))
    for i in order[:total - sum(counts)]:
        counts[i] += 1
    return counts
