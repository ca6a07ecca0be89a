"""Routers the simulator compares: plain, fixed (method, k), static rules, per-server EMA,
the learned policy, and an oracle.

A router sees the request and the pools' live views and answers (pool, k); `k = None`
lets the chosen worker pick (the per-server EMA does). `observe` gets every finished
request; `tick` runs between arrivals (the learned policy refits there, and asks for a
relaunch of a fixed-k pool at the desired k the policy published; the simulator takes the
pool out of service for the relaunch time, as the supervisor's drain-stop-launch does).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.acceptance import expected_accept_length
from policies.policy import Policy, PolicyConfig
from policies.sim.calibration import LoadCurve, true_step_s
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord


@dataclass(frozen=True, slots=True)
class SimPool:
    name: str
    engine: str
    method: str
    k: int
    per_request_k: bool
    workers: int
    max_k: int = 12
    curve: str = "sglang-eagle1"
    group: str = "fleet"  # pools of one group run on the same workers (share batches)


@dataclass(slots=True)
class SimRequest:
    index: int
    arrival_s: float
    task: str
    temperature: float
    bucket: str
    prompt_tokens: int
    output_tokens: int
    phase: int


@dataclass
class SimRouter:
    """Base: route to the first pool at its configured k."""

    name: str
    fleet: tuple[SimPool, ...]

    def route(self, req: SimRequest, pools: list[PoolView], now: float
              ) -> tuple[str, int | None, bool]:
        return pools[0].name, pools[0].k, False

    def worker_k(self, worker: int, batch: int) -> int:
        raise NotImplementedError

    def observe(self, rec: RequestRecord) -> None:
        return None

    def tick(self, now: float, pools: dict[str, PoolView]) -> dict[str, tuple[int, float]]:
        """Relaunches to start: pool -> (new k, seconds out of service); none by default."""
        return {}


@dataclass
class StaticRules(SimRouter):
    """A hand-written class -> pool table (what a gateway without telemetry would do)."""

    rules: dict[str, str] = field(default_factory=dict)

    def route(self, req, pools, now):
        by_name = {p.name: p for p in pools}
        pool = by_name[self.rules.get(req.task, pools[0].name)]
        return pool.name, pool.k, False


@dataclass
class Oracle(SimRouter):
    """Knows the true acceptance and every worker's batch; best pool, and any k on pools
    that take k per request (a fixed-k pool only at its k)."""

    truth: object = None  # callable (method, task, bucket, phase) -> a
    base_step_s: float = 0.015
    least_batch: object = None  # callable pool name -> batch of its least-loaded worker

    def route(self, req, pools, now):
        best = ("", 0, -1.0)
        for view, spec in zip(pools, self.fleet, strict=True):
            if view.healthy_workers <= 0:
                continue
            batch = self.least_batch(view.name) + 1
            a = (self.truth(spec.method, req.task, req.bucket, req.phase)
                 if spec.method != "plain" else 0.0)
            curve = LoadCurve(spec.curve)
            ks = range(0, spec.max_k + 1) if spec.per_request_k else (view.k,)
            for k in ks if spec.method != "plain" else (0,):
                tps = expected_accept_length(a, k) / true_step_s(spec.method, k, batch, curve,
                                                                 self.base_step_s)
                if tps > best[2]:
                    best = (view.name, k, tps)
        return best[0], best[1], False


class AdaptiveSlot:
    """SGLang `--speculative-adaptive` step selection for one batch-size tier.

    Re-implemented from the behaviour of sglang 0.5.23 `srt/speculative/
    adaptive_spec_params.py` (`AdaptiveStepSlot`): EMA (alpha 0.2) of accepted drafts,
    10 warm-up updates, a decision every 5, step down when the EMA is at most
    (previous candidate - 0.5 + down hysteresis), up when above (current - 0.5).
    """

    def __init__(self, candidates: list[int], initial: int, down_hysteresis: float) -> None:
        self.candidates = sorted(candidates)
        self.steps = initial if initial in self.candidates else \
            self.candidates[len(self.candidates) // 2]
        self.ema = float(self.steps - 1)
        self.down = down_hysteresis
        self.count = 0

    def update(self, accepted_drafts: float) -> None:
        if self.steps > 0:
            self.ema = 0.8 * self.ema + 0.2 * accepted_drafts
        self.count += 1
        if self.count <= 10 or (self.count - 10) % 5:
            return
        i = self.candidates.index(self.steps)
        if self.steps == 0:
            i = min(i + 1, len(self.candidates) - 1)
            if self.candidates[i] > 0 and self.ema < 0:
                self.ema = float(self.candidates[i] - 1)
        else:
            start = i
            while i > 0:
                prev = self.candidates[i - 1]
                if self.ema <= (0.5 if prev == 0 else prev - 0.5) + self.down:
                    i -= 1
                else:
                    break
            if i == start:
                while i < len(self.candidates) - 1 and self.ema > self.candidates[i] - 0.5:
                    i += 1
        self.steps = self.candidates[i]


# SGLang's default tiers (REFERENCES.md): batch >= key -> candidate steps, down hysteresis.
SGLANG_TIERS = ((1, [1, 3, 5, 7], -0.25), (8, [0, 1, 3], 0.0), (32, [0, 1], 0.0), (64, [0], 0.0))


@dataclass
class PerServerEMA(SimRouter):
    """Homogeneous EAGLE-3 fleet, each server adapting its steps per batch tier."""

    initial_k: int = 3
    _slots: dict = field(default_factory=dict)

    def _slot(self, worker: int, batch: int) -> AdaptiveSlot:
        tier = max(i for i, (edge, _, _) in enumerate(SGLANG_TIERS) if batch >= edge)
        key = (worker, tier)
        if key not in self._slots:
            _, candidates, down = SGLANG_TIERS[tier]
            self._slots[key] = AdaptiveSlot(candidates, self.initial_k, down)
        return self._slots[key]

    def route(self, req, pools, now):
        return pools[0].name, None, False

    def worker_k(self, worker, batch):
        return self._slot(worker, batch).steps

    def observe(self, rec):
        if rec.k > 0:
            self._slot(rec.extra["worker"], rec.extra["batch"]).update(rec.accept_length - 1.0)


@dataclass
class Learned(SimRouter):
    """specroute's policy on an in-process store with the simulator's clock.

    Plays the worker supervisor too: a fixed-k pool whose published desired k differs
    from its k is relaunched (out of service `relaunch_s`) unless its last relaunch ended
    less than `relaunch_interval_s` ago; `relaunch=False` never changes k.
    """

    config: PolicyConfig = field(default_factory=PolicyConfig)
    tau_s: float = 10.0
    refit_every_s: float = 1.0
    relaunch_s: float = 60.0
    relaunch_interval_s: float = 30.0
    relaunch: bool = True
    model: str = "base"
    policy: Policy | None = None
    relaunches: list = field(default_factory=list)  # (time, pool, old k, new k)
    _clock: list = field(default_factory=lambda: [0.0])
    _next_refit: float = 0.0
    _back_at: dict = field(default_factory=dict)  # pool -> time its last relaunch ends

    def __post_init__(self) -> None:
        self.store = LocalTelemetry(self.tau_s, clock=lambda: self._clock[0])
        self.policy = Policy(self.store, self.config)

    def route(self, req, pools, now):
        self._clock[0] = now
        profile = RequestProfile(task=req.task, temperature=req.temperature, top_p=1.0,
                                 prompt_tokens=req.prompt_tokens,
                                 max_tokens=req.output_tokens, stream=False, model=self.model)
        decision = self.policy.decide(profile, pools)
        return decision.pool, decision.k, decision.explored

    def observe(self, rec):
        self._clock[0] = max(self._clock[0], rec.timestamp)
        self.policy.observe(rec)

    def tick(self, now, pools):
        self._clock[0] = now
        changes: dict[str, tuple[int, float]] = {}
        if now < self._next_refit:
            return changes
        self.policy.refit()
        self._next_refit = now + self.refit_every_s
        if not self.relaunch:
            return changes
        for name, k in self.store.desired_k.items():
            view = pools.get(name)
            if view is None or view.per_request_k or k == view.k:
                continue
            if now < self._back_at.get(name, -1e9) + self.relaunch_interval_s:
                continue  # relaunching, or relaunched too recently
            changes[name] = (k, self.relaunch_s)
            self._back_at[name] = now + self.relaunch_s
            self.relaunches.append((now, name, view.k, k))
        return changes
