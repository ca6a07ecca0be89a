"""What the simulator drives: a router is the gateway's `RoutingPolicy` plus the few
things only a simulation has.

Every request is decided as the gateway decides it: `policy.decide(profile, pools)` on
the request's profile (`SimRequest.profile`: the classifier's label, never the true task)
and the pools' live views; every finished request goes to `policy.observe`. The policy is
the gateway's own where one exists (the learned `policies.decision.Policy`, the
first-healthy rule) or a `RoutingPolicy` of bench/sim's (the operator's table, the oracle).

`SimHooks`, the simulation's side:
- `make_fleet(base_step_s, world)`: the workers it serves on (the planner's move; the
  oracle keeps the fleet and the world, whose truth it reads);
- `reveal(req)`: the request about to be decided, as the world knows it (true task,
  phase); only the oracle looks;
- `advance(now)`: simulated time moves (a completion's or an arrival's): the clock a
  learned policy's telemetry store decays by;
- `tick(now, pools)`: between arrivals; the relaunches to start (pool -> (new k, seconds
  out of service)), as a worker supervisor's drain-stop-launch applies a published k.
The protocols live with the simulator that drives them (`bench.sim.simulator`);
`Baseline` gives the defaults: the configured fleet, nothing to see, no clock, no
relaunch. (The engines' own per-batch k — SGLang's EMA, vLLM's batch-size table — runs
in the step-level bench/sim/engine_fleet.py, not here: a decision always names its k.)
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.sim.simulator import Fleet, Relaunches
from bench.sim.types import SimPool, SimRequest
from bench.sim.world import World
from policies.protocol import RoutingPolicy
from policies.types import PoolView


@dataclass
class Baseline:
    """The hooks' defaults (module docstring)."""

    name: str
    fleet: tuple[SimPool, ...]

    def make_fleet(self, base_step_s: float, world: World) -> Fleet:
        return Fleet(self.fleet, base_step_s, world.co_batching,
                     measured_steps=world.measured_steps)

    def reveal(self, req: SimRequest) -> None:
        """Routers see the profile only."""

    def advance(self, now: float) -> None:
        """No clock to move."""

    def tick(self, now: float, pools: dict[str, PoolView]) -> Relaunches:
        return {}


@dataclass
class Routed(Baseline):
    """A router that is only a policy: the gateway's rules (`policies.rules.RULES`), the
    operator's table (`baselines.StaticRules`)."""

    policy: RoutingPolicy
