"""The simulator decides every request through the gateway's policy seam
(`policies.protocol.RoutingPolicy`, bench/sim/router.py): a policy sees the classifier's
profile, never the true task, and learns from every finished request; the gateway's own
rules run in it unchanged; the oracle alone is shown the world's truth."""

from __future__ import annotations

import pytest

from bench.sim.baselines import Oracle
from bench.sim.router import Routed
from bench.sim.scenarios import SGLANG_POOLS
from bench.sim.simulator import Phase, SimConfig, simulate, workload
from bench.sim.world import World
from policies.protocol import Rule
from policies.rules import RULES, static_rules
from policies.types import Decision, PoolView, RequestProfile, RequestRecord

PHASES = (Phase("mix", 400, (("code", 0.0, 1.0), ("chat", 1.0, 1.0)), 20.0, 20.0),)
CONFIG = SimConfig(PHASES, seed=2, world=World())


class Recording(Rule):
    """The gateway's static rule, keeping what it was shown and what it was told."""

    def __init__(self) -> None:
        super().__init__(self._decide, "recording")
        self.profiles: list[RequestProfile] = []
        self.records: list[RequestRecord] = []

    def _decide(self, profile: RequestProfile, pools: list[PoolView]) -> Decision:
        self.profiles.append(profile)
        return static_rules(profile, pools)

    def observe(self, record: RequestRecord) -> None:
        self.records.append(record)


def test_policies_see_the_classifiers_profile_and_every_finished_request() -> None:
    requests = workload(CONFIG)
    assert any(r.label != r.task for r in requests)  # the world mislabels some
    policy = Recording()
    outcomes = simulate(Routed("recording", SGLANG_POOLS.fleet, policy), CONFIG, requests)
    assert [p.task for p in policy.profiles] == [r.seen_task for r in requests]
    assert [p.temperature_bucket for p in policy.profiles] == [r.bucket for r in requests]
    assert [p.max_tokens for p in policy.profiles] == [r.output_tokens for r in requests]
    assert len(policy.records) == len(requests)
    # the static rule sends sampled chat (thigh) to plain, code elsewhere
    by_pool = {o.index: o.pool for o in outcomes}
    hot = [r.index for r in requests if r.bucket == "thigh"]
    assert {by_pool[i] for i in hot} == {"plain"}


def test_the_gateways_rules_run_unchanged() -> None:
    requests = workload(CONFIG)
    first = simulate(Routed("first", SGLANG_POOLS.fleet, RULES["first"]), CONFIG, requests)
    assert {o.pool for o in first} == {SGLANG_POOLS.fleet[0].name}
    assert all(o.k == SGLANG_POOLS.fleet[0].k for o in first)


def test_the_oracle_decides_only_a_revealed_request() -> None:
    oracle = Oracle("oracle", SGLANG_POOLS.fleet)
    fleet = oracle.make_fleet(CONFIG.base_step_s, CONFIG.world)
    profile = workload(CONFIG)[0].profile(CONFIG.model)
    with pytest.raises(RuntimeError):
        oracle.policy.decide(profile, fleet.views())
    oracle.reveal(workload(CONFIG)[0])
    decision = oracle.policy.decide(profile, fleet.views())
    assert decision.pool in {s.name for s in SGLANG_POOLS.fleet}
