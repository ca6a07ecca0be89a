"""Recent traffic kept in memory for the operator console (`gateway.http.console`).

A `Recorder` like the others of the fan-out (`gateway.telemetry.prometheus`): `record`
only adds a finished request to a few bounded structures — O(1), on the event loop's turn
after the response was flushed (`gateway.telemetry.record.Reporter`), never on the
request's path. What it keeps, all of it bounded by the config:

- per pool, a ring of `PoolSample`s, one per `sample_interval_s` over `span_s` (10 s for
  an hour: 360 per pool), closed by `sample()` from the console's loop; the interval
  still open is shown as a live last point;
- the last `decisions` requests: class, pool, k, accept length, latency. A
  `RequestRecord` carries no prompt, output or key, so neither can this;
- per tenant and per request class on each pool, the last `window` requests, behind the
  console's percentiles and observed tokens/s;
- in each sample, a hybrid pool's decode steps and accepted draft tokens per branch (the
  record's `extra["drafts"]`), summed over the hour by `drafts(pool)`.

Definitions (the policy's, so prediction and observation compare): accept length is
output tokens per verify step (bonus token included), over the requests whose worker
reported its steps; tokens/s is a request's decode rate, tokens after the first over the
time after the first, pooled over requests (sum of tokens / sum of time).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from policies.types import RequestRecord


@dataclass(frozen=True, slots=True)
class RecentConfig:
    sample_interval_s: float = 10.0
    span_s: float = 3600.0
    decisions: int = 50
    window: int = 200

    @property
    def samples(self) -> int:
        return max(1, math.ceil(self.span_s / self.sample_interval_s))


@dataclass(frozen=True, slots=True)
class PoolSample:
    at: float  # unix time the interval ended (now, for the live one)
    seconds: float  # the interval's length
    requests: int
    failed: int
    accept_length: float | None  # None: no request reported its verify steps
    tokens_per_s: float | None  # a request's decode rate; None: no request decoded
    output_tokens_per_s: float  # the pool's output over the interval
    live: bool = False  # the interval still open
    drafts: dict[str, tuple[int, int]] | None = None  # branch -> (steps, accepted); hybrid

    def to_dict(self) -> dict:
        """By hand: `dataclasses.asdict` deep-copies every field, slow over full rings."""
        return {"at": self.at, "seconds": self.seconds, "requests": self.requests,
                "failed": self.failed, "accept_length": self.accept_length,
                "tokens_per_s": self.tokens_per_s,
                "output_tokens_per_s": self.output_tokens_per_s, "live": self.live}


@dataclass(slots=True)
class Tally:
    """Sums over some requests, from which accept length and tokens/s follow."""

    requests: int = 0
    failed: int = 0
    output_tokens: int = 0
    steps: int = 0  # verify steps, of the requests that reported them
    stepped_tokens: int = 0  # output tokens of those requests
    decode_tokens: int = 0  # tokens after the first
    decode_s: float = 0.0
    drafts: dict[str, tuple[int, int]] | None = None  # branch -> (steps, accepted)

    def add(self, record: RequestRecord) -> None:
        self.requests += 1
        if not record.ok:
            self.failed += 1
            return
        if (drafts := record.extra.get("drafts")) is not None:
            self.drafts = add_drafts(self.drafts, drafts)
        tokens = record.output_tokens
        self.output_tokens += tokens
        if record.verify_steps:
            self.steps += record.verify_steps
            self.stepped_tokens += tokens
        decode_s = record.itl_s * (tokens - 1)
        if tokens > 1 and decode_s > 0 and math.isfinite(decode_s):
            self.decode_tokens += tokens - 1
            self.decode_s += decode_s

    @property
    def accept_length(self) -> float | None:
        return self.stepped_tokens / self.steps if self.steps else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None

    def sample(self, at: float, seconds: float, live: bool = False) -> PoolSample:
        return PoolSample(at=round(at, 3), seconds=round(seconds, 3), requests=self.requests,
                          failed=self.failed, accept_length=_round(self.accept_length, 4),
                          tokens_per_s=_round(self.tokens_per_s, 2),
                          output_tokens_per_s=round(self.output_tokens / max(seconds, 1e-9), 2),
                          live=live, drafts=self.drafts)


def add_drafts(into: dict[str, tuple[int, int]] | None,
               drafts: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Branch counts summed: `into` (None: none yet) plus `drafts`, as a new dict."""
    out = dict(into or {})
    for branch, (steps, accepted) in drafts.items():
        old = out.get(branch, (0, 0))
        out[branch] = (old[0] + steps, old[1] + accepted)
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True, slots=True)
class RecentDecision:
    """One finished request as the console lists it: never its prompt, output or key."""

    at: float
    model: str
    tenant: str
    task: str
    temperature_bucket: str
    pool: str
    method: str
    k: int
    ok: bool
    pinned: bool
    explored: bool
    output_tokens: int
    accept_length: float
    ttft_ms: float
    e2e_ms: float
    slo_met: bool
    anomaly: str | None = None  # acceptance far outside its prediction (telemetry.record)

    @classmethod
    def of(cls, record: RequestRecord) -> RecentDecision:
        return cls(at=record.timestamp, model=record.model, tenant=record.tenant,
                   task=record.task, temperature_bucket=record.temperature_bucket,
                   pool=record.pool, method=record.method, k=record.k, ok=record.ok,
                   pinned=record.pinned, explored=bool(record.extra.get("explored")),
                   output_tokens=record.output_tokens,
                   accept_length=round(record.accept_length, 3),
                   ttft_ms=round(record.ttft_s * 1000, 2), e2e_ms=round(record.e2e_s * 1000, 2),
                   slo_met=record.slo_met, anomaly=record.extra.get("anomaly"))


@dataclass(frozen=True, slots=True)
class TenantLatency:
    """A tenant's last requests: SLO attainment and TTFT / TPOT percentiles (ms)."""

    requests: int
    attainment: float | None  # share of finished requests that met the SLO
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None

    def to_dict(self) -> dict:
        return asdict(self)  # flat: no nested dataclass to copy


def percentile(values: list[float], q: float) -> float | None:
    """Nearest rank (the smallest value with at least q of the values at or below it)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


ClassKey = tuple[str, str, str, str]  # model, task, temperature bucket, pool


class RecentTraffic:
    """See the module docstring. Used from the event loop only (record, sample, reads)."""

    def __init__(self, config: RecentConfig | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config or RecentConfig()
        self.clock = clock
        self.opened_at = clock()
        self._open: dict[str, Tally] = {}
        self._rings: dict[str, deque[PoolSample]] = {}
        # the records themselves: appending a reference is all `record` pays
        self._decisions: deque[RequestRecord] = deque(maxlen=self.config.decisions)
        self._tenants: dict[str, deque[RequestRecord]] = {}
        self._classes: dict[ClassKey, deque[RequestRecord]] = {}

    # Recorder
    def record(self, record: RequestRecord) -> None:
        self._open.setdefault(record.pool, Tally()).add(record)
        self._decisions.append(record)
        window = self.config.window
        self._tenants.setdefault(record.tenant, deque(maxlen=window)).append(record)
        if record.ok:
            key = (record.model, record.task, record.temperature_bucket, record.pool)
            self._classes.setdefault(key, deque(maxlen=window)).append(record)

    def sample(self) -> None:
        """Close the open interval: one sample per pool that served in it (a pool without
        traffic gets an empty sample, so the plot shows the gap)."""
        now = self.clock()
        seconds = max(now - self.opened_at, 1e-9)
        for pool in set(self._rings) | set(self._open):
            ring = self._rings.setdefault(pool, deque(maxlen=self.config.samples))
            ring.append(self._open.get(pool, Tally()).sample(now, seconds))
        self._open = {}
        self.opened_at = now

    def due(self) -> bool:
        return self.clock() - self.opened_at >= self.config.sample_interval_s

    # reads, for the console
    def pools(self) -> list[str]:
        return sorted(set(self._rings) | set(self._open))

    def samples(self, pool: str) -> list[PoolSample]:
        """The pool's closed samples, oldest first, then the open interval's (live)."""
        out = list(self._rings.get(pool, ()))
        tally = self._open.get(pool)
        if tally is not None and tally.requests:
            now = self.clock()
            out.append(tally.sample(now, max(now - self.opened_at, 1e-9), live=True))
        return out

    def drafts(self, pool: str) -> dict[str, tuple[int, int]] | None:
        """A hybrid pool's decode steps and accepted draft tokens per branch over its ring
        and the open interval; None when no request of it reported them."""
        total = None
        for sample in self._rings.get(pool, ()):
            if sample.drafts:
                total = add_drafts(total, sample.drafts)
        tally = self._open.get(pool)
        if tally is not None and tally.drafts:
            total = add_drafts(total, tally.drafts)
        return total

    def decisions(self) -> list[RecentDecision]:
        """The last requests, newest first."""
        return [RecentDecision.of(record) for record in reversed(self._decisions)]

    def tenants(self) -> list[str]:
        return sorted(self._tenants)

    def tenant_latency(self, tenant: str) -> TenantLatency:
        entries = list(self._tenants.get(tenant, ()))
        done = [r for r in entries if r.ok]
        ttft = [r.ttft_s * 1000 for r in done]
        tpot = [r.itl_s * 1000 for r in done if r.output_tokens > 1]
        return TenantLatency(
            requests=len(entries),
            attainment=sum(r.slo_met for r in entries) / len(entries) if entries else None,
            ttft_p50_ms=percentile(ttft, 0.5), ttft_p99_ms=percentile(ttft, 0.99),
            tpot_p50_ms=percentile(tpot, 0.5), tpot_p99_ms=percentile(tpot, 0.99))

    def observed(self, model: str, task: str, bucket: str, pool: str) -> Tally:
        """The class's last requests on `pool`, summed."""
        tally = Tally()
        for record in self._classes.get((model, task, bucket, pool), ()):
            tally.add(record)
        return tally
