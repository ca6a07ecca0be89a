"""The fleet planner: how many workers each fixed (method, k) pool of a model should have
(`plan`: the fleet's value, the search, relaunch cost and dwell; `inputs`: what it plans
from, read from the learned policy's state and telemetry, or from the launch benchmark;
`launch`: the benchmark's shape and the launch plan; `benchmarked`: the benchmark from the
workers' own measurements). docs/FLEET.md."""

from policies.planner.benchmarked import benchmarked_from_measured, unmeasured
from policies.planner.inputs import demand_from_snapshot, measured_speed, state_speed
from policies.planner.launch import Benchmarked, candidate_configs
from policies.planner.plan import (
    ClassDemand,
    FleetPlan,
    FleetValue,
    PlannerConfig,
    PoolSlot,
    Speed,
    cold_demand,
    evaluate,
    moves_between,
    next_move,
    plan,
    settle,
    trusted,
)

__all__ = ["Benchmarked", "ClassDemand", "FleetPlan", "FleetValue", "PlannerConfig", "PoolSlot",
           "Speed", "benchmarked_from_measured", "candidate_configs", "cold_demand",
           "demand_from_snapshot", "evaluate", "measured_speed", "moves_between", "next_move",
           "plan", "settle", "state_speed", "trusted", "unmeasured"]
