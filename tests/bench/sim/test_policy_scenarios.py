"""Fleet scenarios: the vLLM fleet (fixed-k pools, relaunch to change k) and its load
curves, and the relaunch rules of the policy's desired k."""

from __future__ import annotations

from bench.sim.baselines import Learned, first_pool
from bench.sim.calibration import LoadCurve, true_step_s
from bench.sim.evaluation import summarize
from bench.sim.scenarios import EMBEDDED, SCENARIOS, VLLM
from bench.sim.simulator import Fleet, Phase, SimConfig, simulate, workload
from policies.decision import Policy, PolicyConfig
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord


def test_vllm_curves_reproduce_the_sources() -> None:
    """Table 5 and the vLLM blog, as absolute speedups at batch 2 and 56."""
    def speedup(method: str, curve: str, tau: float, k: int, batch: int) -> float:
        c = LoadCurve(curve)
        return tau / k_steps(method, k, batch, c)

    def k_steps(method: str, k: int, batch: int, c: LoadCurve) -> float:
        return true_step_s(method, k, batch, c, 1.0) / true_step_s("plain", 0, batch, c, 1.0)

    assert abs(speedup("eagle3", "vllm-eagle3", 6.13, 8, 56) - 1.01) < 0.01
    assert abs(speedup("eagle", "vllm-eagle1", 3.98, 5, 56) - 0.71) < 0.01
    assert abs(speedup("draft", "vllm-draft", 2.27, 4, 2) - 1.5) < 0.01
    assert abs(speedup("draft", "vllm-draft", 2.27, 4, 56) - 1 / 1.4) < 0.01
    assert abs(speedup("ngram", "vllm-ngram", 2.50, 10, 56) - 1 / 1.8) < 0.01


def test_scenarios_offer_only_their_engines_methods() -> None:
    assert {s.method for s in VLLM.fleet} == {"plain", "eagle3", "eagle", "ngram", "draft"}
    assert not any(s.per_request_k for s in VLLM.fleet)  # vLLM fixes k at launch
    assert sum(s.workers for s in VLLM.fleet) == 12 and VLLM.fixed_k
    assert "eagle3" not in {s.method for s in EMBEDDED.fleet} and not EMBEDDED.fixed_k
    assert set(SCENARIOS) == {"sglang-pools", "embedded", "vllm", "sglang-shared"}
    assert [s.name for s in SCENARIOS.values() if not s.deployable] == ["sglang-shared"]
    pools = SCENARIOS["sglang-pools"]
    assert pools.fixed_k and not any(s.per_request_k for s in pools.fleet)
    assert sum(s.workers for s in pools.fleet) == 12
    assert len({s.group for s in pools.fleet}) == len(pools.fleet)  # own workers each


def test_fleet_partitions_workers_and_takes_relaunching_pools_out() -> None:
    fleet = Fleet(VLLM.fleet)
    assert fleet.workers["plain"][0] is not fleet.workers["eagle3-k2"][0]  # own workers
    fleet.relaunch("eagle3-k2", 6, now=10.0, out_of_service_s=60.0)
    down = {v.name: v for v in fleet.views()}["eagle3-k2"]
    assert down.healthy_workers == 0 and down.k == 2
    fleet.advance(69.0)
    assert {v.name: v for v in fleet.views()}["eagle3-k2"].healthy_workers == 0
    fleet.advance(70.0)
    back = {v.name: v for v in fleet.views()}["eagle3-k2"]
    assert back.healthy_workers == 2 and back.k == 6


def test_vllm_fleet_at_saturation_sheds_speculation_and_keeps_up_with_plain() -> None:
    """Load ramps to ~9 req/s per worker: Table 5 puts EAGLE-1 at 0.71x and EAGLE-3 at
    1.01x plain by batch 56, so the policy moves traffic to plain and low k."""
    phases = (Phase("saturation", 1500, (("chat", 1.0, 0.4), ("code", 0.0, 0.3),
                                         ("structured", 0.0, 0.3)), 40.0, 110.0),)
    config = SimConfig(phases, seed=5)
    requests = workload(config)
    ours = simulate(Learned("adaptive", VLLM.fleet, PolicyConfig(seed=5)), config, requests)
    plain = simulate(first_pool("plain", VLLM.homogeneous("plain", 0)), config, requests)
    ratio = (summarize("a", ours, 1).mean_tokens_per_s
             / summarize("p", plain, 1).mean_tokens_per_s)
    print(f"vLLM fleet, saturation: adaptive / plain fleet = {ratio:.3f}")
    assert ratio >= 0.98

    def mean_k(part: list) -> float:
        return sum(o.k for o in part) / len(part)

    # the policy's own picks: cold-start tries (each pool at its k, plain included) are
    # front-loaded and would count as low-k choices of the first third
    picked = [o for o in ours if not o.explored]
    third = len(picked) // 3
    assert mean_k(picked[-third:]) < mean_k(picked[:third])  # less speculation at peak load
    assert sum(o.k <= 2 for o in picked[-third:]) > sum(o.k <= 2 for o in picked[:third])


PROFILE = RequestProfile(task="code", temperature=0.0, top_p=1.0, prompt_tokens=200,
                         max_tokens=256, stream=False, model="m")


def _fixed_pools(down: str = "") -> list[PoolView]:
    return [PoolView(name, "vllm", "eagle3", 1, False, 0 if name == down else 2, 1, 8)
            for name in ("e3-a", "e3-b")]


def _feed(policy: Policy, pool: str, n: int) -> None:
    for _ in range(n):  # a ~ 0.9 at k = 1: the pool leaves most of its speedup unused
        policy.observe(RequestRecord(
            model="m", pool=pool, method="eagle3", k=1, task="code", temperature_bucket="t0",
            prompt_tokens=200, output_tokens=190, verify_steps=100, accept_length=1.9,
            load=1, ttft_s=0.021, itl_s=0.021, e2e_s=2.1, workers=2, timestamp=1.0))


def test_relaunch_asks_one_pool_at_a_time_and_only_on_evidence() -> None:
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    policy = Policy(store, PolicyConfig(explore_rate=0.0, relaunch_cost_s=3.0))
    policy.decide(PROFILE, _fixed_pools())
    _feed(policy, "e3-a", 5)  # too few requests behind the acceptance: keep k
    policy.refit()
    assert store.desired_k == {"e3-a": 1, "e3-b": 1}
    _feed(policy, "e3-a", 40)
    _feed(policy, "e3-b", 40)
    for _ in range(2):  # the wish must hold for relaunch_cost_s of refits (3 here)
        policy.refit()
        assert store.desired_k == {"e3-a": 1, "e3-b": 1}
    policy.refit()
    changed = [name for name, k in store.desired_k.items() if k != 1]
    assert len(changed) == 1 and store.desired_k[changed[0]] > 1  # one relaunch at a time
    store.desired_k.clear()
    policy.decide(PROFILE, _fixed_pools(down="e3-a"))  # e3-a is relaunching
    policy.refit()
    assert store.desired_k == {}  # nothing published until it is back


def test_relaunch_needs_a_gain_that_repays_the_outage() -> None:
    cheap = Policy(LocalTelemetry(), PolicyConfig(relaunch_cost_s=6.0))
    dear = Policy(LocalTelemetry(), PolicyConfig(relaunch_cost_s=6000.0))
    assert cheap.desired_k.relaunch_gain == PolicyConfig().desired_k_gain
    assert dear.desired_k.relaunch_gain == 10.0
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    policy = Policy(store, PolicyConfig(explore_rate=0.0, relaunch_cost_s=6000.0))
    policy.decide(PROFILE, _fixed_pools())
    _feed(policy, "e3-a", 40)
    policy.refit()
    assert store.desired_k.get("e3-a") == 1  # a ~ 0.9 gains < 10x: not worth an outage
