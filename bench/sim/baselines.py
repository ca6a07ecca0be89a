"""Routers the simulator compares: plain, fixed (method, k), hand-written rules, the
learned policy, and a per-class oracle. (The engines' own adaptive k — SGLang's
per-batch EMA, vLLM's batch-size schedule — re-chooses k per verify batch and runs in
the step-level bench/sim/engine_fleet.py.)

A router sees the request as the gateway would (the classifier's label, never the true
task) and the pools' live views, and answers (pool, k); `k = None` lets the chosen worker
pick (the engine-side baselines do). `observe` gets every finished
request; `tick` runs between arrivals (the learned policy refits there, and asks for a
relaunch of a fixed-k pool at the desired k the policy published; the simulator takes the
pool out of service for the relaunch time, as the supervisor's drain-stop-launch does).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.sim.calibration import draft_cost
from bench.sim.steplaw import MODEL_FREE
from policies.acceptance import expected_accept_length
from policies.decision import Policy, PolicyConfig
from policies.prior import WorkerPrior
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord

if TYPE_CHECKING:
    from bench.sim.world import World


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
    law: str = ""  # the engine's step law (bench/sim/steplaw.py) where the world measures


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
    label: str = ""  # the classifier's task (what routers see); "" = the true task
    z_model: float = 0.0  # per-prompt acceptance draws (bench/sim/world.py)
    z_text: float = 0.0

    @property
    def seen_task(self) -> str:
        return self.label or self.task


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
    """A hand-written table, what an operator without telemetry would write: (task,
    temperature bucket) -> (pool, k); k None = the pool's configured k. Keys fall back
    from (task, bucket) to (task, "*")."""

    rules: dict[tuple[str, str], tuple[str, int | None]] = field(default_factory=dict)

    def route(self, req, pools, now):
        by_name = {p.name: p for p in pools}
        task = req.seen_task
        pool, k = self.rules.get((task, req.bucket)) or self.rules[(task, "*")]
        view = by_name[pool]
        if view.healthy_workers <= 0:  # relaunching (never, for this router): any pool up
            view = next(p for p in pools if p.healthy_workers > 0)
            return view.name, view.k, False
        return view.name, view.k if k is None or not view.per_request_k else k, False


@dataclass
class Oracle(SimRouter):
    """Per-class oracle: knows the true task, the world's acceptance law for the class
    (averaged over its prompts, not this prompt's draw), the drafter degradation, and
    every worker's batch; picks the pool, and any k on pools that take k per request (a
    fixed-k pool only at its k), that adds the most output to the least-loaded worker of
    the pool: (batch tokens per step + this request's) / new step time - batch tokens
    per step / old step time. Maximising the request's own tokens/s instead (what the
    policy does) ignores that its k slows the whole batch: in this simulator that greedy
    oracle falls to ~0.7x the best fixed k on shared workers. `truth` (method, task, bucket, phase) -> a, when given,
    replaces the world with the i.i.d. chain law at that a (the policy's own model)."""

    truth: Callable[[str, str, str, int], float] | None = None
    base_step_s: float = 0.015
    phase_scale: tuple[float, ...] = ()
    trained: frozenset = frozenset()
    any_k: bool = False  # fixed-k pools at any k up to max_k too (an upper bound)
    _fleet: object = None
    _world: World | None = None

    def attach(self, fleet, world) -> None:
        self._fleet, self._world = fleet, world

    def route(self, req, pools, now):
        best = ("", 0, -1e18)
        for view, spec in zip(pools, self.fleet, strict=True):
            if view.healthy_workers <= 0:
                continue
            _, worker = self._fleet.least_worker(view.name)
            ks = (range(0, spec.max_k + 1) if spec.per_request_k or self.any_k
                  else (view.k,))
            for k in ks if spec.method != "plain" else (0,):
                length = self._length(spec.method, req, k)
                depth = self._world.depth(spec.method, k) if self.truth is None else k
                draft = draft_cost(spec.method) * depth if k > 0 else 0.0
                step_s = worker.batch_step_s((spec.curve, k, draft,
                                              k > 0 and spec.method not in MODEL_FREE))
                if self._world.co_batching:
                    now_tps = worker.tokens_per_step / worker.step_s if worker.batch else 0.0
                    tps = (worker.tokens_per_step + length) / step_s - now_tps
                else:
                    tps = length / step_s
                if tps > best[2]:
                    best = (view.name, k, tps)
        return best[0], best[1], False

    def _length(self, method: str, req: SimRequest, k: int) -> float:
        if k <= 0 or method == "plain":
            return 1.0
        if self.truth is not None:
            return expected_accept_length(self.truth(method, req.task, req.bucket, req.phase), k)
        if self._world is None:
            raise RuntimeError("attach(fleet, world) before routing")
        scale = self.phase_scale[req.phase] if method in self.trained else 1.0
        return self._world.expected_accept_length(method, req.task, req.bucket, k, scale)


@dataclass
class Learned(SimRouter):
    """specroute's policy on an in-process store with the simulator's clock, at the
    policy config's decay; `worker_priors` are what each pool's workers published about
    themselves (none: the flat prior).

    Plays the worker supervisor too: a fixed-k pool whose published desired k differs
    from its k is relaunched (out of service `relaunch_s`) unless its last relaunch ended
    less than `relaunch_interval_s` ago; `relaunch=False` never changes k.
    """

    config: PolicyConfig = field(default_factory=PolicyConfig)
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

    worker_priors: dict[str, WorkerPrior] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.store = LocalTelemetry(self.config.decay_tau_s, clock=lambda: self._clock[0])
        self.policy = Policy(self.store, self.config)
        for pool, prior in self.worker_priors.items():
            self.policy.set_worker_prior(pool, prior)

    @property
    def tau_s(self) -> float:
        """The decay the policy's store runs at: the policy config's (the gateway's)."""
        return self.config.decay_tau_s

    def route(self, req, pools, now):
        self._clock[0] = now
        profile = RequestProfile(task=req.seen_task, temperature=req.temperature, top_p=1.0,
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
