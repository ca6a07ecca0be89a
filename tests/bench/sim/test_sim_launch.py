"""The launch benchmark runs in the world (held-out prompts, sampled steps, timing noise),
and the relaunch costs come from the repo's records (bench/sim/launch.py, relaunch.py)."""

from __future__ import annotations

import re
from pathlib import Path

from bench.sim import relaunch
from bench.sim.launch import launch_bench, launched
from bench.sim.scenarios import SCENARIOS, SGLANG_RELAUNCH_S, VLLM_RELAUNCH_S
from bench.sim.world import World

ROOT = Path(__file__).resolve().parents[3]


def test_the_benchmark_measures_rather_than_reads_the_world() -> None:
    world = World()
    bench = {(b.method, b.k): b for b in launch_bench(SCENARIOS["sglang-pools"], world, 0)}
    deep = bench[("eagle3", 12)]
    expected = world.expected_accept_length("eagle3", "code", "t0", 12)
    measured = deep.accept_length[("code", "t0")]
    assert measured != expected and abs(measured / expected - 1) < 0.15  # a sample of it
    assert ("edit", "t0") in deep.accept_length
    assert deep.step_s[0] < deep.step_s[-1]  # batch 1 to 64
    # input-grounded edits: n-gram far ahead of its own code figure
    ngram = bench[("ngram", 12)]
    assert ngram.accept_length[("edit", "t0")] > 3 * ngram.accept_length[("code", "t0")]


def test_the_launched_fleet_has_the_scenarios_workers_and_per_class_priors() -> None:
    scenario, plan, priors = launched(SCENARIOS["vllm"], World(), 0)
    assert sum(s.workers for s in scenario.fleet) == 12
    assert all(not s.per_request_k for s in scenario.fleet)
    assert {s.name for s in scenario.fleet} == {p.name for p in plan.pools}
    for pool in scenario.fleet:
        if pool.method != "plain":
            keys = {key[2] for key in priors[pool.name].acceptance}
            assert {"code", "chat", "structured", "edit"} <= keys


def test_relaunch_costs_are_read_from_the_records() -> None:
    records = relaunch.records()
    text = " ".join((ROOT / "docs/results/2026-12-01-vllm.md").read_text().split())
    measured = re.search(r"\((\d+) s to serve again\)", text)
    assert measured is not None and VLLM_RELAUNCH_S == float(measured.group(1))
    assert SGLANG_RELAUNCH_S == records["sglang"] == 90.0
    # the drain + relaunch lies between one eager start and the whole stack's start
    assert records["vllm-eager-start"] < records["vllm"] < records["vllm-stack-ready"]
