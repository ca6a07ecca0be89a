"""SLO-aware choice among the options the policy predicts: which pool and k meets a
tenant's latency targets, and under load, which one leaves headroom to higher priorities.

Inputs, per option (a pool at the k the policy would run there, or a speculative pool
run plain): the policy's predicted tokens/s and accept length (`Policy.predict`), the
predicted queue wait (gateway/routing/admission.py), whether the pool is busy, and how much
higher-priority work it holds. Targets: the tenant's `slo_ttft_ms`, `slo_tpot_ms`.

- predicted TPOT = 1000 / tokens per second; predicted TTFT = the queue wait (prefill is
  inside the policy's step-time fit, not separate);
- an option **meets** the SLO when both are within target;
- not yielding (nothing of higher priority is in flight on a busy pool): keep the
  policy's pick if it meets, else the fastest option that meets, else the policy's pick;
- **yielding** (some option is busy and higher-priority work runs or waits on one): the
  option that meets at the least cost to the fleet: first one whose pools hold no
  higher-priority work, then the fewest token positions verified per token emitted,
  (k + 1) / accept length (plain = 1: speculation spends extra verify width, the
  batch-mates' step time, on draft tokens that are rejected), then the fastest; if none
  meets, the cheapest anyway (a request that will miss should not also take headroom).

A batch tenant's request under load thereby goes plain, or to a pool without latency
work, while a latency tenant keeps speculation and the headroom. Pure: no I/O, no state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SloTarget:
    tenant: str
    ttft_ms: float
    tpot_ms: float
    priority: int


@dataclass(frozen=True, slots=True)
class SloOption:
    pool: str
    method: str
    k: int
    tokens_per_s: float  # predicted for this request (0: no prediction)
    accept_length: float
    wait_ms: float = 0.0  # predicted queue wait in this pool
    busy: bool = False
    higher_priority: int = 0  # higher-priority requests running or queued in this pool

    @property
    def tpot_ms(self) -> float:
        return 1000.0 / self.tokens_per_s if self.tokens_per_s > 0 else math.inf

    @property
    def fleet_cost(self) -> float:
        """Token positions verified per token emitted: 1 for plain decoding."""
        return (self.k + 1) / max(self.accept_length, 1.0) if self.k else 1.0

    def meets(self, target: SloTarget) -> bool:
        return self.tpot_ms <= target.tpot_ms and self.wait_ms <= target.ttft_ms

    def describe(self) -> str:
        method = self.method if self.k else "plain"
        return (f"{self.pool} {method} k={self.k} (tpot {self.tpot_ms:.0f} ms, "
                f"wait {self.wait_ms:.0f} ms)")


@dataclass(frozen=True, slots=True)
class SloChoice:
    option: SloOption
    reason: str
    changed: bool  # not the policy's pick
    yielded: bool
    meets: bool

    @property
    def kind(self) -> str:
        """The decision's class, for metrics: kept, faster, yielded or missed."""
        if self.yielded:
            return "yielded"
        if not self.meets:
            return "missed"
        return "faster" if self.changed else "kept"


def yielding(options: list[SloOption]) -> bool:
    """Under load with higher-priority work in flight on a busy pool."""
    return any(o.busy for o in options) and any(o.higher_priority for o in options)


def choose(pick: SloOption, options: list[SloOption], target: SloTarget) -> SloChoice:
    """The option to run for a tenant with `target`; `pick` is the policy's own."""
    targets = f"targets ttft {target.ttft_ms:.0f} ms, tpot {target.tpot_ms:.0f} ms"
    meeting = [o for o in options if o.meets(target)]
    if yielding(options):
        pool = meeting or options
        best = min(pool, key=lambda o: (o.higher_priority > 0, o.fleet_cost, o.tpot_ms))
        verdict = "meets" if best.meets(target) else "no option meets; cheapest"
        return SloChoice(best, f"slo {target.tenant} (priority {target.priority}) yields "
                         f"under load to higher-priority work: {best.describe()} "
                         f"{verdict}, {targets}", best != pick, True, best.meets(target))
    if pick.meets(target):
        return SloChoice(pick, f"slo {target.tenant}: policy's pick meets "
                         f"({pick.describe()}), {targets}", False, False, True)
    if meeting:
        best = min(meeting, key=lambda o: o.tpot_ms + o.wait_ms)
        return SloChoice(best, f"slo {target.tenant}: policy's pick misses "
                         f"({pick.describe()}); fastest that meets: {best.describe()}, "
                         f"{targets}", True, False, True)
    return SloChoice(pick, f"slo {target.tenant}: no option predicted to meet, keeping "
                     f"the policy's pick ({pick.describe()}), {targets}", False, False, False)
