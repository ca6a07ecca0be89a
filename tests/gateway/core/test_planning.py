"""The gateway's fleet planner loop (gateway/core/planning.py) on a real Redis: with
the workers' measurements published through their registry entries it plans as the
simulator's measured planner does for the same inputs; without them, from the learned
state, and says so once."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from gateway.config import parse_config
from gateway.core.planning import FleetPlanning, current_fleet
from gateway.pools import build_pools
from gateway.upstream.worker_priors import WorkerPriors
from policies.decision import Policy
from policies.keys import desired_fleet_key
from policies.planner import (
    FleetPlan,
    PlannerConfig,
    PoolSlot,
    Speed,
    cold_demand,
    measured_speed,
    plan,
    state_speed,
)
from policies.telemetry import LocalTelemetry
from tests.policies.test_planner_benchmarked import EAGLE3, NGRAM, PLAIN, document
from workers.fleet.registry import WorkerInfo

MODEL = "m"
CONFIG = PlannerConfig(relaunch_s=60.0, dwell_s=0.0)
POOLS = {"ngram-k8": ("ngram", 8, 1), "eagle3-k6": ("eagle3", 6, 4), "plain": ("plain", 0, 1)}


def planning(redis_url: str, pools: dict = POOLS, published: tuple[str, ...] = (),
             files: dict[str, str] | None = None) -> FleetPlanning:
    """The loop over sglang pools of `MODEL` (worker counts as given); the pools in
    `published` have a worker whose registry entry carries the measured.json of its
    (method, k), handed to the policy as the discovery does; `files`: pools' configured
    `measured` files."""
    built = build_pools(parse_config({"redis_url": redis_url, "pools": [
        {"name": name, "engine": "sglang", "model": MODEL, "method": method, "k": k,
         "workers": [f"http://{name}-{i}:30000" for i in range(n)],
         **({"measured": (files or {})[name]} if name in (files or {}) else {})}
        for name, (method, k, n) in pools.items()]}))
    policy = Policy(LocalTelemetry(60.0))
    priors = WorkerPriors(built, None, policy.set_worker_prior, 1.0)  # type: ignore[arg-type]
    for name in published:
        method, k, _ = pools[name]
        measured = next(b for b in (NGRAM, EAGLE3) if (b.method, b.k) == (method, k))
        priors.from_registry(built[name], WorkerInfo(
            url=f"http://{name}-0:30000", pool=name, engine="sglang", method=method, k=k,
            model=MODEL, started_at=0.0, pid=1, measured=document(measured)))
    policy.refit()
    return FleetPlanning(built, policy, policy.store, redis_url, CONFIG)


def expected(loop: FleetPlanning, speed: Speed, config: PlannerConfig) -> FleetPlan:
    """What the planner wants before traffic with `speed`: the simulator's planner call
    (bench/sim/planned.py `Planned.desired_fleet`) on the loop's pools and fleet."""
    pools = list(loop.pools.values())
    slots = {p.name: PoolSlot(p.name, p.config.method, p.config.k) for p in pools}
    current = current_fleet(pools, None)
    return plan(MODEL, current, slots, cold_demand(sum(current.values()), speed, config),
                speed, config, None, loop.policy.state.measured_k)


def test_measured_priors_plan_as_the_simulators_measured_planner(redis_url: str) -> None:
    loop = planning(redis_url, published=("ngram-k8", "eagle3-k6"))
    got = loop.plan_all()[MODEL]
    # the sim's measured rows: the benchmark as the speed, no k trust region
    want = expected(loop, measured_speed((NGRAM, EAGLE3, PLAIN), loop.policy.state, MODEL),
                    replace(CONFIG, k_trust_margin=None))
    assert got.desired == want.desired
    assert got.desired_tokens_per_s == pytest.approx(want.desired_tokens_per_s, rel=1e-6)
    assert got.shares == want.shares
    # what the figures imply: edits on n-gram (6.0 tokens a step against 3.2), chat and
    # code on EAGLE-3 (3.4 and 3.3 against 1.2 and 1.6), so both pools keep workers
    assert got.shares["edit/t0"] == {"ngram-k8": 1.0}
    assert got.shares["chat/t0"] == {"eagle3-k6": 1.0}
    assert got.desired["ngram-k8"] >= 1 and got.desired["eagle3-k6"] >= 1
    assert got.desired != got.current and got.adopted
    assert loop.report()["models"][MODEL]["speeds"].startswith("the workers' measurements")
    client = redis.Redis.from_url(redis_url)
    try:
        published = FleetPlan.from_json(client.get(desired_fleet_key(MODEL)) or b"")
    finally:
        client.close()
    assert published.desired == got.desired
    loop.client.close()


def test_without_priors_the_loop_plans_from_the_learned_state_and_says_so_once(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    loop = planning(redis_url)
    slots = {p.name: PoolSlot(p.name, p.config.method, p.config.k)
             for p in loop.pools.values()}
    with caplog.at_level(logging.INFO, logger="specroute.gateway"):
        got = loop.plan_all()[MODEL]
        loop.plan_all()
    want = expected(loop, state_speed(loop.policy.state, MODEL, slots), CONFIG)
    assert got.desired == want.desired and got.shares == want.shares
    said = [r.getMessage() for r in caplog.records if "speeds from" in r.getMessage()]
    assert said == [f"fleet planner, {MODEL}: speeds from the learned state "
                    "(no pool has a measured prior)"]
    loop.client.close()


def test_a_pool_the_measurements_leave_out_keeps_the_learned_state(redis_url: str) -> None:
    pools = {**POOLS, "eagle3-k12": ("eagle3", 12, 0)}
    loop = planning(redis_url, pools, published=("ngram-k8", "eagle3-k6"))
    loop.plan_all()
    assert loop.speeds[MODEL] == "the learned state (no measurement of pools eagle3-k12)"
    loop.client.close()


def test_the_pools_configured_measured_files_are_read_as_well(redis_url: str,
                                                              tmp_path: Path) -> None:
    files = {}
    for name, measured in (("ngram-k8", NGRAM), ("eagle3-k6", EAGLE3)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document(measured)))
        files[name] = str(path)
    loop = planning(redis_url, files=files)
    got = loop.plan_all()[MODEL]
    want = expected(loop, measured_speed((NGRAM, EAGLE3, PLAIN), loop.policy.state, MODEL),
                    replace(CONFIG, k_trust_margin=None))
    assert (got.desired, got.shares) == (want.desired, want.shares)
    assert loop.speeds[MODEL].startswith("the workers' measurements")
    loop.client.close()
