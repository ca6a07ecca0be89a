"""The simulator's movable fleet (bench/sim/planned.py): a moving worker takes no new
requests but finishes those it has, is down for the relaunch, then serves in its new
pool; and a short planner run moves at most one worker at a time."""

from __future__ import annotations

import pytest

from bench.sim.evaluation import worker_priors
from bench.sim.planned import PLANNED, MovableFleet, planned_router
from bench.sim.simulator import Running, SimConfig, default_phases, simulate, workload
from bench.sim.types import SimPool
from bench.sim.world import World
from policies.decision import PolicyConfig
from policies.types import RequestRecord

SPECS = (SimPool("a", "sglang", "eagle3", 3, False, 2, group="a"),
         SimPool("b", "sglang", "eagle3", 5, False, 0, group="b"))


def running(index: int, steps: float) -> Running:
    record = RequestRecord(model="m", pool="a", method="eagle3", k=3, task="code",
                           temperature_bucket="t0", prompt_tokens=1, output_tokens=10,
                           verify_steps=5, accept_length=2.0, load=0, ttft_s=0.0, itl_s=0.0,
                           e2e_s=0.0)
    return Running(steps, index, "a", 0.0, 0.0, record, "sglang-eagle3", 3, 0.0)


def test_a_moving_worker_drains_is_down_then_joins() -> None:
    fleet = MovableFleet(SPECS)
    busy, idle = fleet.workers["a"]
    busy.add(running(0, 100.0))
    fleet.start_move("a", "b", now=0.0, relaunch_s=60.0)
    assert fleet.moving is not None and fleet.moving.worker is idle  # the quickest to drain
    views = {v.name: v.healthy_workers for v in fleet.views()}
    assert views == {"a": 1, "b": 0} and fleet.counts() == {"a": 1, "b": 1}
    fleet.advance(59.0)
    assert fleet.workers["b"] == []
    fleet.advance(60.0)
    assert fleet.workers["b"] == [idle] and fleet.moving is None
    assert fleet.done_moves == [(60.0, "a", "b")]


def test_drain_time_counts_before_the_relaunch() -> None:
    fleet = MovableFleet(SPECS)
    first, second = fleet.workers["a"]
    first.add(running(0, 100.0))
    second.add(running(1, 200.0))
    fleet.start_move("a", "b", now=0.0, relaunch_s=60.0)
    assert fleet.moving is not None and fleet.moving.ready_at > 60.0


def test_planner_run_moves_one_worker_at_a_time() -> None:
    config = SimConfig(default_phases(0.08), seed=0, world=World())
    router = planned_router("planner", PLANNED, PolicyConfig(seed=0),
                            worker_priors(PLANNED, config.world, config.model),
                            config.slo_itl_s, relaunch_s=2.0)
    outcomes = simulate(router, config, workload(config))
    assert all(o is not None for o in outcomes)
    assert router._fleet is not None
    moves = router._fleet.done_moves
    assert router.plans and "no traffic measured" in router.plans[0][1].reason
    ends = [t for t, _, _ in moves]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    assert sum(len(ws) for ws in router._fleet.workers.values()) + (
        router._fleet.moving is not None) == 12


def test_the_measured_planner_launches_its_plan_from_the_benchmark() -> None:
    """Planned from the launch benchmark, the fleet before traffic is the cold plan over
    the measured candidates: 12 workers, the configuration best over the mix among them,
    and no pool below zero."""
    from bench.sim.planned import measured_scenario
    from bench.sim.scenarios import SGLANG_POOLS

    config = SimConfig(default_phases(0.08), seed=0, world=World())
    scenario, bench, priors = measured_scenario(SGLANG_POOLS, config.world, config.seed)
    assert sum(s.workers for s in scenario.fleet) == 12
    assert {s.name for s in scenario.fleet if s.method != "plain"} <= set(priors)
    router = planned_router("planner-measured", scenario, PolicyConfig(seed=0), priors,
                            config.slo_itl_s, relaunch_s=90.0, launch_at_plan=True,
                            bench=bench)
    outcomes = simulate(router, config, workload(config))
    assert all(o is not None for o in outcomes)
    launched = router.plans[0][1].desired
    assert min(launched.values()) >= 0 and sum(launched.values()) == 12
    first = next(s.name for s in scenario.fleet if s.workers == 12)
    assert launched[first] == max(launched.values())


def test_the_gateway_loop_plans_as_the_simulators_measured_planner(redis_url: str) -> None:
    """The simulator's launch benchmark published as the pools' measured.json (entries
    and costs for every (method, k) it ran): the gateway's planner loop plans, before
    traffic, the fleet the simulator's `planner-measured` row launches (seed 0: n-gram
    k 12 x12 since the step law's overhead is per draft forward, docs/POLICY.md; EAGLE-3
    k 12 x10, n-gram k 12 x2 before)."""
    from dataclasses import replace

    from bench.sim.planned import measured_scenario
    from bench.sim.scenarios import SGLANG_POOLS
    from gateway.config import parse_config
    from gateway.core.planning import FleetPlanning
    from gateway.pools import build_pools
    from gateway.upstream.worker_priors import WorkerPriors
    from policies.decision import Policy
    from policies.telemetry import LocalTelemetry
    from tests.policies.test_planner_benchmarked import document
    from workers.fleet.registry import WorkerInfo

    config = SimConfig(default_phases(0.08), seed=0, world=World())
    scenario, bench, priors = measured_scenario(SGLANG_POOLS, config.world, config.seed)
    router = planned_router("planner-measured", scenario, PolicyConfig(seed=0), priors,
                            config.slo_itl_s, relaunch_s=90.0, launch_at_plan=True,
                            bench=bench)
    router.make_fleet(config.base_step_s, config.world)
    simulated = router.plans[0][1]

    plain = next(b for b in bench if b.method == "plain")
    published = document(*(b for b in bench if b.method != "plain"), plain=plain)
    pools = build_pools(parse_config({"redis_url": redis_url, "pools": [
        {"name": s.name, "engine": "sglang", "model": router.model, "method": s.method,
         "k": s.k, "workers": [f"http://{s.name}-{i}:30000" for i in range(s.workers)]}
        for s in scenario.fleet]}))
    policy = Policy(LocalTelemetry(60.0))
    discovery = WorkerPriors(pools, None, policy.set_worker_prior, 1.0)  # type: ignore[arg-type]
    for name, pool in pools.items():
        discovery.from_registry(pool, WorkerInfo(
            url=f"http://{name}-0:30000", pool=name, engine="sglang", method=pool.config.method,
            k=pool.config.k, model=router.model, started_at=0.0, pid=1, measured=published))
    policy.refit()
    loop = FleetPlanning(pools, policy, policy.store, redis_url,
                         replace(router.planner, relaunch_s=0.0, dwell_s=0.0))
    try:
        planned = loop.plan_all()[router.model]
    finally:
        loop.client.close()
    assert loop.speeds[router.model].startswith("the workers' measurements")
    assert planned.desired == simulated.desired
    assert planned.desired_tokens_per_s == pytest.approx(simulated.desired_tokens_per_s,
                                                         rel=1e-6)
    assert sum(planned.desired.values()) == 12
