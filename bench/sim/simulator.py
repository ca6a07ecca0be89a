"""Discrete-event simulation of a speculative-decoding fleet under drifting workloads.

Each worker runs one continuous batch. Every verify step advances every request in the
batch by one step, so a worker keeps a virtual step counter and each request finishes
when the counter has advanced by the steps it needs (drawn at dispatch from the world's
acceptance law, bench/sim/world.py). The step time is the batch's: it grows with the
batch's draft tokens, sum over requests of k_i (verify, at the load curve of each
request's method) and their drafting cost, so one request's large k slows every request
it is batched with (co-batching). The step time is re-evaluated at every arrival and
completion on the worker (a fluid approximation between events).

Every router sees the same arrivals, labels and per-prompt draws (same seed). The fleets
(which pools, on which workers, at which k) are in bench/sim/scenarios.py.

Phases (the workload drifts at each boundary): code-heavy greedy; chat at temperature 1;
a load ramp to saturation (batch per worker > 32); a newly fine-tuned target whose
trained drafters (EAGLE*, Medusa, draft model) accept less — `drafter_scale`, a scenario
parameter no table gives; n-gram and lookahead draft from the text and are unaffected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from bench.sim.calibration import LoadCurve, plain_step_s
from bench.sim.steplaw import MODEL_FREE, StepLaw, drafting_cost, law
from bench.sim.types import SimPool, SimRequest
from bench.sim.world import World
from bench.sim.world import sample_steps as world_steps
from policies.protocol import RoutingPolicy
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
    # the policy's own model unless a world is given; `specroute bench policy` runs World()
    world: World = World.ideal()


EDIT_SHARE = 0.2  # of every phase's requests: the edit class (bench/sim/calibration.py)


def default_phases(scale: float = 1.0, edit_share: float = EDIT_SHARE) -> tuple[Phase, ...]:
    """The four phases; `edit_share` of each phase's requests are edits (greedy, or at
    T 1 in the sampled-chat phase), the rest keep their mix (0: the world before edits,
    docs/results/2026-12-02-fleet-policy.md). The share is an assumption, set before
    any run and not varied to make a figure."""
    n = max(int(2500 * scale), 50)

    def mix(*entries: tuple[str, float, float], edit_t: float = 0.0
            ) -> tuple[tuple[str, float, float], ...]:
        if edit_share <= 0:
            return entries
        rest = tuple((task, t, w * (1.0 - edit_share)) for task, t, w in entries)
        return (*rest, ("edit", edit_t, edit_share * sum(w for _, _, w in entries)))

    return (
        Phase("code-greedy", n, mix(("code", 0.0, 0.7), ("structured", 0.0, 0.2),
                                    ("chat", 0.0, 0.1)), 30.0, 30.0),
        Phase("chat-t1", n, mix(("chat", 1.0, 0.75), ("code", 1.0, 0.15),
                                ("structured", 0.5, 0.1), edit_t=1.0), 30.0, 30.0),
        Phase("saturation", int(n * 1.2), mix(("chat", 1.0, 0.4), ("code", 0.0, 0.3),
                                              ("structured", 0.0, 0.3)), 40.0, 110.0),
        Phase("fine-tuned", n, mix(("code", 0.0, 0.5), ("chat", 0.0, 0.3),
                                   ("structured", 0.0, 0.2)), 30.0, 30.0, drafter_scale=0.7),
    )


def workload(config: SimConfig) -> list[SimRequest]:
    """Arrivals, true tasks, classifier labels and per-prompt draws (same for every router)."""
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
    world_rng = np.random.default_rng(config.seed + 7)  # apart, so arrivals match old runs
    labels = config.world.label_draws(world_rng, [r.task for r in out])
    draws = config.world.family_draws(world_rng, len(out))
    for req, label, (z_model, z_text) in zip(out, labels, draws, strict=True):
        req.label, req.z_model, req.z_text = label, float(z_model), float(z_text)
    return out


def sample_steps(rng: np.random.Generator, a: float, k: int, tokens: int) -> int:
    """Verify steps to emit `tokens` under the i.i.d. chain law E(a, k) (the policy's)."""
    return world_steps(rng, a, 1.0, k, tokens)


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


@dataclass(slots=True)
class Running:
    finish_v: float  # the worker's virtual step count at which this request is done
    index: int
    pool: str
    arrival_s: float
    ttft_s: float
    record: RequestRecord
    curve: str
    k: int
    draft: float  # drafting cost, plain(1) steps per verify step
    reports_batch: bool = False  # an embedded worker reports the batches it rode
    model_drafter: bool = False  # its drafter is a model (the engine's drafting overhead)
    seen_steps: float = 0.0  # verify steps integrated over the request's life, and over
    batch_sum: float = 0.0  # them the batch's size and its draft tokens
    draft_sum: float = 0.0

    def ride(self, steps: float, batch: int, drafted: float) -> None:
        self.seen_steps += steps
        self.batch_sum += batch * steps
        self.draft_sum += drafted * steps

    def report_batch(self, rec: RequestRecord) -> None:
        """What an embedded worker puts in its response: the mean batch over the steps."""
        if self.reports_batch and self.seen_steps > 0:
            rec.batch = self.batch_sum / self.seen_steps
            rec.batch_draft_tokens = self.draft_sum / self.seen_steps


def batch_step_s(base_step_s: float, b: int, verify: float, drafting: float) -> float:
    """A step of `b` requests whose verify overhead (sum of lambda_i(b) k_i) and drafting
    (sum of draft_i) are given: plain(b) * (1 + verify / b) + plain(1) * drafting / b."""
    return (plain_step_s(b, base_step_s) * (1.0 + verify / b)
            + plain_step_s(1, base_step_s) * drafting / b)


def law_step_s(base_step_s: float, step_law: StepLaw, b: int, tokens: float,
               drafting: float, model_drafters: int) -> float:
    """The world's step (bench/sim/steplaw.py): `b` sequences verifying `tokens` in all,
    their drafting (sum of draft_i, batched: plain(1) * mean), and the engine's drafting
    overhead once per step when any sequence drafts with a model."""
    if b <= 0:
        return base_step_s
    return base_step_s * (step_law.step(b, tokens) + drafting / b
                          + (step_law.overhead if model_drafters > 0 else 0.0))


def uniform_step_s(base_step_s: float, curve: str, b: int, k: int, draft: float,
                   step_law: StepLaw | None = None, method: str = "") -> float:
    """`b` requests all at `k`, each drafting `draft`: what a worker's batch benchmark
    measures (`specroute bench batching --write-costs`)."""
    if step_law is not None:
        model = b if k > 0 and method not in MODEL_FREE else 0
        return law_step_s(base_step_s, step_law, b, b * (k + 1), draft * b, model)
    verify = LoadCurve(curve).overhead_per_token(b) * k * b if k > 0 else 0.0
    return batch_step_s(base_step_s, b, verify, draft * b)


class Worker:
    """One continuous batch. `v` counts verify steps done since start; a step takes
    `step_s`, the batch's step time, recomputed whenever the batch changes."""

    def __init__(self, base_step_s: float, co_batching: bool = True,
                 step_law: StepLaw | None = None) -> None:
        self.base_step_s = base_step_s
        self.co_batching = co_batching
        self.law = step_law  # None: the policy's linear form (bench/sim/calibration.py)
        self.model_drafters = 0  # requests in the batch drafting with a model
        self.v = 0.0
        self.t = 0.0
        self.running: list[Running] = []
        self.draft_k: dict[str, int] = {}  # load curve -> sum of k over the batch
        self.drafting = 0.0  # sum of drafting costs over the batch
        self.tokens_per_step = 0.0  # sum of realised accept lengths (the batch's output)
        self.k_total = 0  # draft tokens per step over the batch
        self.step_s = plain_step_s(1, base_step_s)

    @property
    def batch(self) -> int:
        return len(self.running)

    def advance(self, now: float) -> None:
        b = len(self.running)
        if self.running and self.co_batching:
            dv = (now - self.t) / self.step_s
            self.v += dv
            for r in self.running:
                r.ride(dv, b, self.k_total)
        elif self.running:  # each request at its own step time; finish_v = steps left
            for r in self.running:
                dv = (now - self.t) / self.own_step_s(r)
                r.finish_v -= dv
                r.ride(dv, b, b * r.k)
        self.t = now

    def own_step_s(self, r: Running) -> float:
        """Without co-batching (the policy's own model): a batch of this request's k."""
        b = len(self.running)
        verify = LoadCurve(r.curve).overhead_per_token(b) * r.k if r.k > 0 else 0.0
        return (plain_step_s(b, self.base_step_s) * (1.0 + verify)
                + plain_step_s(1, self.base_step_s) * r.draft)

    def batch_step_s(self, extra: tuple | None = None) -> float:
        """Step time of the batch (plus one more request `extra` = (curve, k, draft cost)).

        plain(b) * (1 + sum_i lambda_i(b) k_i / b) + plain(1) * sum_i draft_i / b: the
        verify pass carries every request's k_i + 1 tokens, the draft passes run batched."""
        b = len(self.running) + (extra is not None)
        if b == 0:
            return plain_step_s(1, self.base_step_s)
        if self.law is not None and self.co_batching:
            tokens, drafting, model = b + self.k_total, self.drafting, self.model_drafters
            if extra is not None:
                tokens += extra[1]
                drafting += extra[2]
                model += extra[1] > 0 and len(extra) > 3 and bool(extra[3])
            return law_step_s(self.base_step_s, self.law, b, tokens, drafting, model)
        if not self.co_batching and extra is not None:
            curve, k, draft = extra[:3]
            verify = LoadCurve(curve).overhead_per_token(b) * k if k > 0 else 0.0
            return (plain_step_s(b, self.base_step_s) * (1.0 + verify)
                    + plain_step_s(1, self.base_step_s) * draft)
        verify = sum(LoadCurve(c).overhead_per_token(b) * k for c, k in self.draft_k.items())
        drafting = self.drafting
        if extra is not None:
            verify += LoadCurve(extra[0]).overhead_per_token(b) * extra[1]
            drafting += extra[2]
        return batch_step_s(self.base_step_s, b, verify, drafting)

    def _change(self, item: Running, sign: int) -> None:
        self.draft_k[item.curve] = self.draft_k.get(item.curve, 0) + sign * item.k
        self.drafting += sign * item.draft
        self.tokens_per_step += sign * item.record.accept_length
        self.k_total += sign * item.k
        self.model_drafters += sign * item.model_drafter
        self.step_s = self.batch_step_s()

    def add(self, item: Running) -> None:
        self.running.append(item)
        self._change(item, +1)

    def next_finish(self) -> float:
        if not self.running:
            return math.inf
        if not self.co_batching:
            return self.t + min(max(r.finish_v, 0.0) * self.own_step_s(r) for r in self.running)
        first = min(r.finish_v for r in self.running)
        return self.t + max(first - self.v, 0.0) * self.step_s

    def pop_finished(self) -> Running:
        item = min(self.running, key=lambda r: (r.finish_v, r.index))
        self.running.remove(item)
        self._change(item, -1)
        if not self.running:
            self.draft_k, self.drafting, self.tokens_per_step, self.k_total = {}, 0.0, 0.0, 0
            self.model_drafters = 0
        return item


@dataclass
class Fleet:
    """Workers per group: pools of one group run on the same workers (share batches). A
    relaunching pool is out of service (no healthy workers) until its new k is up;
    requests already on it finish."""

    specs: tuple[SimPool, ...]
    base_step_s: float = 0.015
    co_batching: bool = True
    measured_steps: bool = False  # the world's step law (SimPool.law), else the linear form
    k: dict[str, int] = field(default_factory=dict)
    workers: dict[str, list[Worker]] = field(default_factory=dict)
    down_until: dict[str, float] = field(default_factory=dict)
    pending_k: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        groups: dict[str, list[Worker]] = {}
        for spec in self.specs:
            self.k[spec.name] = spec.k
            self.workers[spec.name] = groups.setdefault(
                spec.group, [Worker(self.base_step_s, self.co_batching,
                                    law(spec.law) if self.measured_steps and spec.law else None)
                             for _ in range(spec.workers)])
        self.all_workers = [w for ws in groups.values() for w in ws]

    @property
    def active(self) -> dict[str, list[int]]:
        return {name: [w.batch for w in ws] for name, ws in self.workers.items()}

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
                         sum(w.batch for w in self.workers[s.name]), s.max_k)
                for s in self.specs]

    def least_batch(self, pool: str) -> int:
        return min(w.batch for w in self.workers[pool])

    def least_worker(self, pool: str) -> tuple[int, Worker]:
        workers = self.workers[pool]
        i = min(range(len(workers)), key=lambda j: workers[j].batch)
        return i, workers[i]

    def next_finish(self) -> tuple[float, Worker | None]:
        best: tuple[float, Worker | None] = (math.inf, None)
        for w in self.all_workers:
            t = w.next_finish()
            if t < best[0]:
                best = (t, w)
        return best


Relaunches = dict[str, tuple[int, float]]  # pool -> (new k, seconds out of service)


class SimHooks(Protocol):
    def make_fleet(self, base_step_s: float, world: World) -> Fleet: ...

    def reveal(self, req: SimRequest) -> None: ...

    def advance(self, now: float) -> None: ...

    def tick(self, now: float, pools: dict[str, PoolView]) -> Relaunches: ...


class SimRouter(SimHooks, Protocol):
    """A router the simulator runs: a name, the fleet it is given, its policy, its hooks."""

    name: str
    fleet: tuple[SimPool, ...]

    @property
    def policy(self) -> RoutingPolicy: ...



def simulate(router: SimRouter, config: SimConfig, requests: list[SimRequest]
             ) -> list[Outcome]:
    """Serve `requests` with `router`'s decisions (bench/sim/router.py: its policy decides
    each request's profile, observes each finished one); one Outcome per request, in order."""
    rng = np.random.default_rng(config.seed + 1)
    world = config.world
    fleet = router.make_fleet(config.base_step_s, world)
    specs = {s.name: s for s in router.fleet}
    policy = router.policy
    outcomes: list[Outcome] = []

    def finish_until(now: float) -> None:
        while True:
            t, worker = fleet.next_finish()
            if worker is None or t > now:
                return
            worker.advance(t)
            item = worker.pop_finished()
            e2e = item.ttft_s + (t - item.arrival_s)
            rec = item.record
            item.report_batch(rec)
            rec.e2e_s, rec.timestamp = e2e, t
            rec.itl_s = (e2e - rec.ttft_s) / max(rec.output_tokens - 1, 1)
            rec.slo_met = e2e / rec.output_tokens <= config.slo_itl_s
            router.advance(t)
            policy.observe(rec)
            outcomes[item.index] = Outcome(
                item.index, requests[item.index].phase, item.arrival_s, rec.task,
                rec.temperature_bucket, item.pool, rec.k, bool(rec.extra.get("explored")),
                rec.output_tokens / e2e, e2e, rec.slo_met)

    outcomes = [None] * len(requests)  # type: ignore[list-item]
    for req in requests:
        now = req.arrival_s
        finish_until(now)
        fleet.advance(now)
        router.advance(now)
        for name, (new_k, out_of_service_s) in router.tick(
                now, {v.name: v for v in fleet.views()}).items():
            fleet.relaunch(name, new_k, now, out_of_service_s)
        router.reveal(req)
        decision = policy.decide(req.profile(config.model), fleet.views())
        pool, explored = decision.pool, decision.explored
        spec = specs[pool]
        index, worker = fleet.least_worker(pool)
        batch = worker.batch + 1
        k = 0 if spec.method == "plain" else decision.k
        a, depth, decay = 0.0, 0, 1.0
        if k > 0:
            scale = (config.phases[req.phase].drafter_scale
                     if spec.method in TRAINED_DRAFTERS else 1.0)
            a = world.prompt_accept(spec.method, req.task, req.bucket, req.z_model,
                                    req.z_text, scale)
            depth, decay = world.depth(spec.method, k), world.decay(spec.method)
        steps = world_steps(rng, a, decay, depth, req.output_tokens)
        draft = drafting_cost(law(spec.law) if world.measured_steps and spec.law else None,
                              spec.method, depth if k > 0 else 0)
        worker.advance(now)
        load = sum(w.batch for w in fleet.workers[pool])
        model_drafter = k > 0 and spec.method not in MODEL_FREE
        first_step = worker.batch_step_s((spec.curve, k, draft, model_drafter))
        ttft = req.prompt_tokens * config.prefill_s_per_token + first_step
        rec = RequestRecord(
            model=config.model, pool=pool, method=spec.method if k else "plain", k=k,
            task=req.seen_task, temperature_bucket=req.bucket,
            prompt_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
            verify_steps=steps, accept_length=req.output_tokens / steps, load=load,
            ttft_s=ttft, itl_s=0.0, e2e_s=0.0, workers=len(fleet.workers[pool]),
            extra={"worker": index, "batch": batch, "explored": explored})
        # the first step is inside the TTFT; the request then needs steps - 1 more
        start = worker.v if world.co_batching else 0.0
        worker.add(Running(start + steps - 1 + 1e-9, req.index, pool, now, ttft, rec,
                           spec.curve, k, draft, reports_batch=spec.engine == "embedded",
                           model_drafter=model_drafter))
    finish_until(math.inf)
    return outcomes
