"""The gateway's fleet planner loop: every `interval_s`, per served model, plan the
workers per pool (policies/planner/) and publish the plan in Redis
(`policies.fleet.desired_fleet_key`) for the supervisors or the Kubernetes controller to
follow; `GET /v1/routing/fleet` shows the latest plans.

Speeds as the simulator's winning planner reads them (`measured_speed`,
docs/results/2026-12-04-fleet.md): from what the model's workers measured about
themselves (their `measured.json`, handed to the policy as worker priors by
gateway/upstream/worker_priors.py, or the pool's configured `measured` file), each
(method, k) valued by its measured accept length per class over its measured step time,
the learned acceptance only as a drift; no k trust region then, as nothing is
extrapolated in k. Where the measurements leave a pool of the model out (its (method, k)
never measured, or no measurement at all), the plan reads the learned state alone
(`state_speed`); each change of source is logged once.

The current fleet is the workers each pool has (configured and registered, draining
ones included), with the worker that a supervisor is moving (`fleet_move_key`) counted
in the pool it is moving to. The plan published before is the planner's `previous`
(hysteresis), so gateway replicas, which read the same telemetry, converge on one plan.
Planning runs in a thread; Redis failing only skips the publication.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import replace

import redis

from gateway.config import GatewayConfig
from gateway.periodic import Periodic
from gateway.pools import Pool
from gateway.routing.policy import LearnedRoutingPolicy
from policies.decision import Policy
from policies.keys import desired_fleet_key, fleet_move_key
from policies.learner import PolicyState
from policies.planner import (
    Benchmarked,
    FleetPlan,
    PlannerConfig,
    PoolSlot,
    Speed,
    benchmarked_from_measured,
    demand_from_snapshot,
    measured_speed,
    plan,
    settle,
    state_speed,
    unmeasured,
)
from policies.prior import Measured, WorkerPrior
from policies.protocol import RoutingPolicy
from policies.telemetry import Telemetry

log = logging.getLogger("specroute.gateway")


def current_fleet(pools: list[Pool], moving: dict | None) -> dict[str, int]:
    """Workers per pool, the moving worker counted where it goes."""
    counts = {p.name: len(p.workers) for p in pools}
    dst, src, url = (str(moving.get(key)) for key in ("dst", "src", "url")) if moving \
        else ("", "", "")
    if dst in counts:
        if any(w.url == url for p in pools if p.name == src for w in p.workers):
            counts[src] -= 1  # still registered where it was (draining)
        counts[dst] += 1
    return counts


def measured_bench(slots: Mapping[str, PoolSlot], priors: Mapping[str, WorkerPrior],
                   configured: Mapping[str, Measured]) -> tuple[Benchmarked, ...]:
    """The benchmark of every (method, k) the model's pools' workers measured, from their
    priors and the pools' configured `measured` files (a document that several pools
    publish counts once)."""
    documents = {prior.measured: None for name, prior in priors.items()
                 if name in slots and prior.measured is not None}
    documents.update((doc, None) for name, doc in configured.items() if name in slots)
    return benchmarked_from_measured(documents)


class FleetPlanning:
    def __init__(self, pools: dict[str, Pool], policy: Policy, store: Telemetry,
                 redis_url: str, config: PlannerConfig, interval_s: float = 10.0) -> None:
        self.pools = pools
        self.policy = policy
        self.store = store
        self.config = config
        self.client = redis.Redis.from_url(redis_url, socket_timeout=1.0,
                                           socket_connect_timeout=1.0)
        self.plans: dict[str, FleetPlan] = {}
        self.planned_at: float | None = None
        self.published: dict[str, bool] = {}
        self.speeds: dict[str, str] = {}  # model -> where its speeds come from
        self.configured = {name: Measured.from_dict(doc) for name, p in pools.items()
                           if (doc := p.config.measured_document()) is not None}
        self._loop = Periodic("specroute-fleet-planner", self.tick, interval_s)

    async def start(self) -> None:
        self._loop.start(wait_first=True)

    async def stop(self) -> None:
        await self._loop.stop()
        self.client.close()

    async def tick(self) -> None:
        try:
            await asyncio.to_thread(self.plan_all)
        except Exception:  # noqa: BLE001 - a failed plan must not end the loop
            log.exception("fleet planning failed")

    def plan_all(self) -> dict[str, FleetPlan]:
        """Plan and publish every model's fleet (blocking: Redis and the search)."""
        snapshot = self.store.snapshot()
        state = self.policy.state
        by_model: dict[str, list[Pool]] = {}
        for pool in self.pools.values():
            by_model.setdefault(pool.config.model, []).append(pool)
        for model, pools in sorted(by_model.items()):
            previous, moving = self._read(model)
            slots = {p.name: PoolSlot(p.name, p.config.method,
                                      0 if p.config.method == "plain" else p.config.k)
                     for p in pools}
            speed, config = self._speed(model, slots, state)
            wished = plan(model, current_fleet(pools, moving), slots,
                          demand_from_snapshot(snapshot, model, self.store.tau_s),
                          speed, config, previous.desired if previous is not None else None,
                          state.measured_k)
            dwell = self.config.dwell_s if self.config.dwell_s is not None \
                else self.config.relaunch_s
            result = settle(wished, previous, time.time(), dwell)
            self.plans[model] = result
            self.published[model] = self._publish(model, result)
        self.planned_at = time.time()
        return self.plans

    def _speed(self, model: str, slots: dict[str, PoolSlot], state: PolicyState
               ) -> tuple[Speed, PlannerConfig]:
        """From the workers' measurements when they cover every pool, else the state."""
        bench = measured_bench(slots, self.policy.worker_priors, self.configured)
        missing = unmeasured(bench, slots.values())
        if bench and not missing:
            self._source(model, f"the workers' measurements ({len(bench)} configurations)")
            return measured_speed(bench, state, model), replace(self.config,
                                                                k_trust_margin=None)
        why = (f"no measurement of pools {', '.join(missing)}" if bench
               else "no pool has a measured prior")
        self._source(model, f"the learned state ({why})")
        return state_speed(state, model, slots), self.config

    def _source(self, model: str, source: str) -> None:
        if self.speeds.get(model) != source:
            log.info("fleet planner, %s: speeds from %s", model, source)
        self.speeds[model] = source

    def _read(self, model: str) -> tuple[FleetPlan | None, dict | None]:
        try:
            raw_plan, raw_move = self.client.mget([desired_fleet_key(model),
                                                   fleet_move_key(model)])
        except redis.RedisError as exc:
            log.warning("fleet planner cannot read Redis: %s", exc)
            return self.plans.get(model), None
        previous = None
        try:
            previous = FleetPlan.from_json(raw_plan) if raw_plan else None
            moving = json.loads(raw_move) if raw_move else None
        except (ValueError, TypeError):
            return None, None
        return previous, moving if isinstance(moving, dict) else None

    def _publish(self, model: str, result: FleetPlan) -> bool:
        try:
            self.client.set(desired_fleet_key(model), result.to_json())
        except redis.RedisError as exc:
            log.warning("fleet planner cannot publish for %s: %s", model, exc)
            return False
        return True

    def report(self) -> dict:
        """What `GET /v1/routing/fleet` answers."""
        return {"planned_at": self.planned_at, "relaunch_s": self.config.relaunch_s,
                "horizon_s": self.config.horizon_s,
                "models": {model: {"current": p.current, "desired": p.desired,
                                   "predicted_gain": round(p.gain, 4), "moves": p.moves,
                                   "reason": p.reason,
                                   "current_tokens_per_s": round(p.current_tokens_per_s, 2),
                                   "desired_tokens_per_s": round(p.desired_tokens_per_s, 2),
                                   "class_shares": p.shares, "wish": p.wish,
                                   "adopted": p.adopted, "speeds": self.speeds.get(model),
                                   "published": self.published.get(model, False)}
                           for model, p in sorted(self.plans.items())}}


def fleet_planning(config: GatewayConfig, pools: dict, routing: RoutingPolicy
                   ) -> FleetPlanning | None:
    """The fleet planner loop (`FleetPlanning` above): with Redis and the learned policy
    only; relaunch cost, payback horizon and hysteresis are the policy's, and it plans
    every 10 refits."""
    if not config.redis_url or not isinstance(routing, LearnedRoutingPolicy):
        return None
    policy = config.policy
    planner = PlannerConfig(relaunch_s=policy.relaunch_cost_s,
                            horizon_s=policy.relaunch_payback_s, hysteresis=policy.hysteresis)
    return FleetPlanning(pools, routing.policy, routing.store, config.redis_url, planner,
                         interval_s=10 * policy.refit_interval_s)
