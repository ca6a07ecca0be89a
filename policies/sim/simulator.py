"""Discrete-event simulation of a speculative-decoding fleet under drifting workloads.

Each worker decodes its requests in a continuous batch. Fluid approximation: a request's
decode time is its sampled verify steps times the step time at the worker's batch when it
was dispatched (policies/calibration.py), so events are only arrivals and completions.
Accept lengths per step are drawn i.i.d. from the truncated geometric law behind
E(a, k) (arXiv 2211.17192), with the true `a` of (method, task, temperature) from the
published tables. Every router sees the same arrivals (same seed). The fleets — which
pools, on which workers, at which k — are in policies/scenarios.py.

Phases (the workload drifts at each boundary): code-heavy greedy; chat at temperature 1;
a load ramp to saturation (batch per worker > 32); a newly fine-tuned target whose
trained drafters (EAGLE*, Medusa, draft model) accept less — `drafter_scale`, a scenario
parameter no table gives; n-gram and lookahead draft from the text and are unaffected.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from policies.acceptance import expected_accept_length
from policies.sim.baselines import SimPool, SimRequest, SimRouter
from policies.sim.calibration import LoadCurve, true_accept, true_step_s
from policies.types import PoolView, RequestRecord, temperature_bucket

TRAINED_DRAFTERS = frozenset({"eagle", "eagle2", "eagle3", "medusa", "draft"})


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    requests: int
    mix: tuple[tuple[str, float, float], ...]  # (task, temperature, weight)
    rate_start: float  # arrivals per second
    rate_end: float
    drafter_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class SimConfig:
    phases: tuple[Phase, ...]
    base_step_s: float = 0.015  # plain decode step at batch 1 (absolute scale only)
    prefill_s_per_token: float = 5e-5
    slo_itl_s: float = 0.025  # per-output-token latency target, time to first token included
    seed: int = 0
    model: str = "base"


def default_phases(scale: float = 1.0) -> tuple[Phase, ...]:
    n = max(int(2500 * scale), 50)
    return (
        Phase("code-greedy", n, (("code", 0.0, 0.7), ("structured", 0.0, 0.2),
                                 ("chat", 0.0, 0.1)), 30.0, 30.0),
        Phase("chat-t1", n, (("chat", 1.0, 0.75), ("code", 1.0, 0.15),
                             ("structured", 0.5, 0.1)), 30.0, 30.0),
        Phase("saturation", int(n * 1.2), (("chat", 1.0, 0.4), ("code", 0.0, 0.3),
                                           ("structured", 0.0, 0.3)), 40.0, 110.0),
        Phase("fine-tuned", n, (("code", 0.0, 0.5), ("chat", 0.0, 0.3),
                                ("structured", 0.0, 0.2)), 30.0, 30.0, drafter_scale=0.7),
    )


def workload(config: SimConfig) -> list[SimRequest]:
    rng = np.random.default_rng(config.seed)
    out: list[SimRequest] = []
    t = 0.0
    for p_index, phase in enumerate(config.phases):
        weights = np.array([w for _, _, w in phase.mix])
        choices = rng.choice(len(phase.mix), size=phase.requests, p=weights / weights.sum())
        for i, c in enumerate(choices):
            rate = phase.rate_start + (phase.rate_end - phase.rate_start) * i / phase.requests
            t += rng.exponential(1.0 / rate)
            task, temperature, _ = phase.mix[c]
            out.append(SimRequest(len(out), t, task, temperature, temperature_bucket(temperature),
                                  int(rng.integers(64, 2048)),
                                  int(np.clip(rng.lognormal(5.3, 0.6), 16, 1024)), p_index))
    return out


def sample_steps(rng: np.random.Generator, a: float, k: int, tokens: int) -> int:
    """Verify steps to emit `tokens`: each step yields min(Geom(1 - a) - 1, k) + 1 tokens."""
    if k <= 0 or a <= 0.0:
        return tokens
    expected = expected_accept_length(a, k)
    size = int(tokens / expected + 4 * math.sqrt(tokens) + 8)
    per_step = np.minimum(rng.geometric(1.0 - a, size=size) - 1, k) + 1
    filled = np.cumsum(per_step)
    if filled[-1] < tokens:
        return size + sample_steps(rng, a, k, tokens - int(filled[-1]))
    return int(np.searchsorted(filled, tokens) + 1)


@dataclass(slots=True)
class Outcome:
    """One request as a router served it."""

    index: int
    phase: int
    arrival_s: float
    task: str
    bucket: str
    pool: str
    k: int
    explored: bool
    tokens_per_s: float
    e2e_s: float
    slo_met: bool


@dataclass
class Fleet:
    """Worker batches; pools of one group run on the same workers and share one list of
    batch sizes. A relaunching pool is out of service (no healthy workers) until its new
    k is up; requests already on it finish."""

    specs: tuple[SimPool, ...]
    k: dict[str, int] = field(default_factory=dict)
    active: dict[str, list[int]] = field(default_factory=dict)
    down_until: dict[str, float] = field(default_factory=dict)
    pending_k: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        groups: dict[str, list[int]] = {}
        for spec in self.specs:
            self.k[spec.name] = spec.k
            self.active[spec.name] = groups.setdefault(spec.group, [0] * spec.workers)

    def relaunch(self, pool: str, k: int, now: float, out_of_service_s: float) -> None:
        self.pending_k[pool] = k
        self.down_until[pool] = now + out_of_service_s

    def advance(self, now: float) -> None:
        """Bring relaunched pools back at their new k."""
        for pool, until in list(self.down_until.items()):
            if now >= until:
                self.k[pool] = self.pending_k.pop(pool)
                del self.down_until[pool]

    def views(self) -> list[PoolView]:
        return [PoolView(s.name, s.engine, s.method, self.k[s.name], s.per_request_k,
                         0 if s.name in self.down_until else s.workers,
                         sum(self.active[s.name]), s.max_k) for s in self.specs]

    def least_batch(self, pool: str) -> int:
        return min(self.active[pool])


def simulate(router: SimRouter, config: SimConfig, requests: list[SimRequest]) -> list[Outcome]:
    """Serve `requests` with `router`'s decisions; one Outcome per request, in order."""
    rng = np.random.default_rng(config.seed + 1)
    fleet = Fleet(router.fleet)
    specs = {s.name: s for s in router.fleet}
    if hasattr(router, "least_batch"):
        router.least_batch = fleet.least_batch
    curves = {s.name: LoadCurve(s.curve) for s in router.fleet}
    running: list[tuple[float, int, str, int, RequestRecord]] = []
    outcomes: list[Outcome] = []
    for req in requests:
        now = req.arrival_s
        while running and running[0][0] <= now:
            _, _, pool, worker, rec = heapq.heappop(running)
            fleet.active[pool][worker] -= 1
            router.observe(rec)
        fleet.advance(now)
        for name, (new_k, out_of_service_s) in router.tick(
                now, {v.name: v for v in fleet.views()}).items():
            fleet.relaunch(name, new_k, now, out_of_service_s)
        pool, k, explored = router.route(req, fleet.views(), now)
        spec = specs[pool]
        worker = int(np.argmin(fleet.active[pool]))
        batch = fleet.active[pool][worker] + 1
        if k is None:
            k = router.worker_k(worker, batch)
        k = 0 if spec.method == "plain" else k
        a = 0.0
        if k > 0:
            scale = config.phases[req.phase].drafter_scale
            a = true_accept(spec.method, req.task, req.bucket)
            a *= scale if spec.method in TRAINED_DRAFTERS else 1.0
        steps = sample_steps(rng, a, k, req.output_tokens)
        step_s = true_step_s(spec.method, k, batch, curves[pool], config.base_step_s)
        ttft = req.prompt_tokens * config.prefill_s_per_token + step_s
        e2e = ttft + (steps - 1) * step_s
        fleet.active[pool][worker] += 1
        rec = RequestRecord(
            model=config.model, pool=pool, method=spec.method if k else "plain", k=k,
            task=req.task, temperature_bucket=req.bucket, prompt_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens, verify_steps=steps,
            accept_length=req.output_tokens / steps, load=sum(fleet.active[pool]) - 1,
            ttft_s=ttft, itl_s=(e2e - ttft) / max(req.output_tokens - 1, 1), e2e_s=e2e,
            timestamp=now + e2e, workers=spec.workers,
            extra={"worker": worker, "batch": batch})
        rec.slo_met = e2e / req.output_tokens <= config.slo_itl_s
        heapq.heappush(running, (now + e2e, req.index, pool, worker, rec))
        outcomes.append(Outcome(req.index, req.phase, now, req.task, req.bucket, pool, k,
                                explored, req.output_tokens / e2e, e2e, rec.slo_met))
    return outcomes
