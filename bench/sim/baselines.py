"""Routers the simulator compares (bench/sim/router.py gives their shape): plain and
fixed (method, k) fleets behind the gateway's first-healthy rule, the operator's
hand-written table, the learned policy, and a per-class oracle. (The engines' own
adaptive k — SGLang's per-batch EMA, vLLM's batch-size schedule — re-chooses k per
verify batch and runs in the step-level bench/sim/engine_fleet.py.)

Each decides from the request's profile (the classifier's label, never the true task)
and the pools' live views, through `RoutingPolicy.decide`; the oracle alone is shown the
world's truth (`reveal`). The learned policy refits at `tick`, between arrivals, and asks
there for a relaunch of a fixed-k pool at the desired k the policy published; the
simulator takes the pool out of service for the relaunch time, as the supervisor's
drain-stop-launch does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from bench.sim.router import Baseline, Relaunches, Routed
from bench.sim.scenarios import Rules
from bench.sim.simulator import Fleet
from bench.sim.steplaw import MODEL_FREE, drafting_cost
from bench.sim.types import SimPool, SimRequest
from bench.sim.world import World, positional_length
from policies.acceptance import expected_accept_length
from policies.decision import Policy, PolicyConfig
from policies.prior import WorkerPrior
from policies.protocol import Rule
from policies.rules import RULES
from policies.telemetry import LocalTelemetry
from policies.types import Decision, PoolView, RequestProfile, RequestRecord


def first_pool(name: str, fleet: tuple[SimPool, ...]) -> Routed:
    """The gateway's first-healthy rule: a homogeneous fleet (plain, a fixed (method, k))
    at its configured k."""
    return Routed(name, fleet, RULES["first"])


class StaticRules(Rule):
    """A hand-written table, what an operator without telemetry would write: (task,
    temperature bucket) -> (pool, k); k None = the pool's configured k. Keys fall back
    from (task, bucket) to (task, "*")."""

    def __init__(self, rules: Rules, name: str = "rules") -> None:
        super().__init__(self._decide, name)
        self.rules = rules

    def _decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        by_name = {p.name: p for p in pools}
        task, bucket = profile.task, profile.temperature_bucket
        pool, k = self.rules.get((task, bucket)) or self.rules[(task, "*")]
        view = by_name[pool]
        if view.healthy_workers <= 0:  # relaunching (never, for this router): any pool up
            view = next(p for p in pools if p.healthy_workers > 0)
            return Decision(view.name, view.method, view.k, "table's pool down: first up")
        return Decision(view.name, view.method,
                        view.k if k is None or not view.per_request_k else k,
                        f"table: {task}/{bucket} -> {pool}")


def static_rules(name: str, fleet: tuple[SimPool, ...], rules: Rules) -> Routed:
    return Routed(name, fleet, StaticRules(rules, name))


class EditRule(Rule):
    """The two-line rule an operator writes from the homogeneous benchmark alone: a request
    the classifier labels an edit, in a temperature bucket of `buckets`, goes to n-gram
    (`edit`: method, k), every other to the best homogeneous fleet's method (`best`:
    method, k). Greedy edits only by default: sampled edits copy little (n-gram's accept
    length 1.2 at T 1, bench/sim/calibration.py), and sending them too overloads an
    n-gram pool sized for the greedy ones (docs/POLICY.md). Among the pools of the
    method, the fewest requests per healthy worker; k is a fixed-k pool's own, else the
    rule's (at most the pool's max_k). A method the fleet lacks falls back to `best`,
    then to any pool up; where `best`'s pools hold under half the workers of the pools
    not of the edit method (a launch that gave them one worker), the other requests go
    to the least loaded of all those pools instead (the rule does not overload a pool
    the launch sized small)."""

    def __init__(self, best: tuple[str, int], edit: tuple[str, int],
                 name: str = "static-rule", buckets: tuple[str, ...] = ("t0",)) -> None:
        super().__init__(self._decide, name)
        self.best, self.edit, self.buckets = best, edit, buckets

    def describe(self) -> str:
        return (f"edit ({'/'.join(self.buckets)}) -> {self.edit[0]} k{self.edit[1]}; else -> "
                f"{self.best[0]} k{self.best[1]} (a fixed-k pool at its own k)")

    def _decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        up = [p for p in pools if p.healthy_workers > 0]
        if not up:
            raise ValueError("no pool with a healthy worker")
        copies = profile.task == "edit" and profile.temperature_bucket in self.buckets
        method, k = self.edit if copies else self.best
        mine = [p for p in up if p.method == method]
        if not mine:
            method, k = self.best
            mine = [p for p in up if p.method == method] or up
        rest = [p for p in up if p.method != self.edit[0]]
        if not copies and (sum(p.healthy_workers for p in mine)
                           < sum(p.healthy_workers for p in rest) / 2):
            mine = rest
        view = min(mine, key=lambda p: p.outstanding / p.healthy_workers)
        return Decision(view.name, view.method,
                        min(k, view.max_k) if view.per_request_k else view.k,
                        f"static rule: {profile.task} -> {view.method}")


def edit_rule(fleet: tuple[SimPool, ...], best: tuple[str, int], edit: tuple[str, int],
              name: str = "static-rule", buckets: tuple[str, ...] = ("t0",)) -> Routed:
    return Routed(name, fleet, EditRule(best, edit, name, buckets))


@dataclass
class Oracle(Baseline):
    """Per-class oracle: knows the true task, the world's acceptance law for the class
    (averaged over its prompts, not this prompt's draw), the drafter degradation, and
    every worker's batch; picks the pool, and any k on pools that take k per request (a
    fixed-k pool only at its k), that adds the most output to the least-loaded worker of
    the pool: (batch tokens per step + this request's) / new step time - batch tokens
    per step / old step time. Maximising the request's own tokens/s instead (what the
    policy does) ignores that its k slows the whole batch: in this simulator that greedy
    oracle falls to ~0.7x the best fixed k on shared workers. `truth` (method, task,
    bucket, phase) -> a, when given, replaces the world with the i.i.d. chain law at that a
    (the policy's own model).

    A `RoutingPolicy` whose knowledge of the request is the world's (`reveal`), not the
    profile: it decides the request last revealed."""

    truth: Callable[[str, str, str, int], float] | None = None
    base_step_s: float = 0.015
    phase_scale: tuple[float, ...] = ()
    trained: frozenset[str] = frozenset()
    any_k: bool = False  # fixed-k pools at any k up to max_k too (an upper bound)
    per_request: bool = False  # the prompt's own acceptance draw, not its class's
    _fleet: Fleet | None = None
    _world: World | None = None
    _request: SimRequest | None = None

    @property
    def policy(self) -> Oracle:
        return self

    def make_fleet(self, base_step_s: float, world: World) -> Fleet:
        self._fleet, self._world = super().make_fleet(base_step_s, world), world
        return self._fleet

    def reveal(self, req: SimRequest) -> None:
        self._request = req

    def decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        req, fleet, world = self._request, self._fleet, self._world
        if req is None or fleet is None or world is None:
            raise RuntimeError("make_fleet, then reveal the request, before deciding")
        best: tuple[SimPool | None, int, float] = (None, 0, -1e18)
        for view, spec in zip(pools, self.fleet, strict=True):
            if view.healthy_workers <= 0:
                continue
            _, worker = fleet.least_worker(view.name)
            ks = (range(0, spec.max_k + 1) if spec.per_request_k or self.any_k
                  else (view.k,))
            for k in ks if spec.method != "plain" else (0,):
                length = self._length(spec.method, req, k)
                depth = world.depth(spec.method, k) if self.truth is None else k
                draft = drafting_cost(worker.law, spec.method, depth if k > 0 else 0)
                step_s = worker.batch_step_s((spec.curve, k, draft,
                                              k > 0 and spec.method not in MODEL_FREE))
                if world.co_batching:
                    now_tps = worker.tokens_per_step / worker.step_s if worker.batch else 0.0
                    tps = (worker.tokens_per_step + length) / step_s - now_tps
                else:
                    tps = length / step_s
                if tps > best[2]:
                    best = (spec, k, tps)
        chosen, k, tps = best
        if chosen is None:
            raise ValueError("no pool with a healthy worker")
        return Decision(chosen.name, chosen.method, k, "oracle: the most output added",
                        predicted_tokens_per_s=tps)

    predict = decide

    def observe(self, record: RequestRecord) -> None:
        """It knows the world: nothing to learn."""

    def set_worker_prior(self, pool: str, prior: WorkerPrior) -> None:
        """Nor to start from."""

    def start(self) -> None:
        """Nothing runs."""

    def stop(self) -> None:
        """Nothing runs."""

    def _length(self, method: str, req: SimRequest, k: int) -> float:
        if k <= 0 or method == "plain":
            return 1.0
        if self.truth is not None:
            return expected_accept_length(self.truth(method, req.task, req.bucket, req.phase), k)
        assert self._world is not None
        scale = self.phase_scale[req.phase] if method in self.trained else 1.0
        world = self._world
        if self.per_request:
            a = world.prompt_accept(method, req.task, req.bucket, req.z_model, req.z_text,
                                    scale)
            return positional_length(a, world.decay(method), world.depth(method, k))
        return world.expected_accept_length(method, req.task, req.bucket, k, scale)


@dataclass
class Learned(Baseline):
    """specroute's policy (`policies.decision.Policy`, the gateway's) on an in-process
    store whose clock is the simulator's (`advance`), at the policy config's decay;
    `worker_priors` are what each pool's workers published about themselves (none: the
    flat prior). The simulator feeds it every finished request (`policy.observe`); it
    refits every `refit_every_s` of simulated time at `tick` (the gateway's refit thread,
    `Policy.start`, is not started).

    Plays the worker supervisor too: a fixed-k pool whose published desired k differs
    from its k is relaunched (out of service `relaunch_s`) unless its last relaunch ended
    less than `relaunch_interval_s` ago; `relaunch=False` never changes k.
    """

    config: PolicyConfig = field(default_factory=PolicyConfig)
    refit_every_s: float = 1.0
    relaunch_s: float = 60.0
    relaunch_interval_s: float = 30.0
    relaunch: bool = True
    model: str = "base"  # the simulated requests' model (SimConfig.model)
    relaunches: list[tuple[float, str, int, int]] = field(
        default_factory=list)  # (time, pool, old k, new k)
    worker_priors: dict[str, WorkerPrior] = field(default_factory=dict)
    policy: Policy = field(init=False)
    _now: float = 0.0
    _next_refit: float = 0.0
    _back_at: dict[str, float] = field(default_factory=dict)  # pool -> its relaunch's end

    def __post_init__(self) -> None:
        self.store = LocalTelemetry(self.config.decay_tau_s, clock=lambda: self._now)
        self.policy = Policy(self.store, self.config)
        for pool, prior in self.worker_priors.items():
            self.policy.set_worker_prior(pool, prior)

    @property
    def tau_s(self) -> float:
        """The decay the policy's store runs at: the policy config's (the gateway's)."""
        return self.config.decay_tau_s

    def advance(self, now: float) -> None:
        self._now = max(self._now, now)

    def tick(self, now: float, pools: dict[str, PoolView]) -> Relaunches:
        self._now = now
        changes: Relaunches = {}
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
