"""The two-line static rule (bench/sim/baselines.py `EditRule`): greedy edits to n-gram,
every other request to the best homogeneous fleet's method; and the launch from the observed
class mix (bench/sim/launch.py), which at edit share 0 launches fewer n-gram workers; SGLang's
adaptive tiers tuned from the same launch benchmark."""

from __future__ import annotations

from bench.sim.baselines import EditRule
from bench.sim.engine_fleet import SGLANG_ADAPTIVE
from bench.sim.launch import benchmark, favoured_k, launched, observed_mix, tuned_tiers
from bench.sim.scenarios import SCENARIOS
from bench.sim.simulator import SimConfig, default_phases, workload
from bench.sim.world import World
from policies.types import PoolView, RequestProfile

POOLS = [PoolView("eagle3-k12", "sglang", "eagle3", 12, False, 8, 4),
         PoolView("eagle3-k8", "sglang", "eagle3", 8, False, 2, 0),
         PoolView("ngram-k12", "sglang", "ngram", 12, False, 2, 0),
         PoolView("plain", "sglang", "plain", 0, False, 2, 0)]
RULE = EditRule(("eagle3", 12), ("ngram", 4))


def profile(task: str, temperature: float = 0.0) -> RequestProfile:
    return RequestProfile(task=task, temperature=temperature, top_p=1.0,  # type: ignore[arg-type]
                          prompt_tokens=10, max_tokens=64, stream=False, model="base")


def test_edits_go_to_ngram_and_the_rest_to_the_best_method() -> None:
    edit = RULE.decide(profile("edit"), POOLS)
    assert (edit.pool, edit.k) == ("ngram-k12", 12)  # a fixed-k pool keeps its k
    for task in ("code", "chat", "structured"):
        decision = RULE.decide(profile(task), POOLS)
        assert decision.method == "eagle3" and decision.pool == "eagle3-k8"  # less loaded
    assert "plain" not in {RULE.decide(profile(t), POOLS).pool for t in ("edit", "chat")}


def test_sampled_edits_stay_on_the_best_method_unless_the_rule_names_their_bucket() -> None:
    assert RULE.decide(profile("edit", 1.0), POOLS).method == "eagle3"
    every = EditRule(("eagle3", 12), ("ngram", 4), buckets=("t0", "tlow", "thigh"))
    assert every.decide(profile("edit", 1.0), POOLS).pool == "ngram-k12"


def test_a_fleet_without_ngram_sends_edits_to_the_best_method_at_its_k() -> None:
    shared = [PoolView("eagle3", "embedded", "eagle3", 4, True, 12, 0, max_k=8),
              PoolView("plain", "embedded", "plain", 0, True, 12, 0)]
    decision = RULE.decide(profile("edit"), shared)
    assert (decision.pool, decision.k) == ("eagle3", 8)  # the rule's k 12, at max_k


def test_the_observed_mix_at_share_0_launches_fewer_ngram_workers() -> None:
    config = SimConfig(default_phases(0.04, 0.0), seed=0, world=World())
    mix = observed_mix(workload(config))
    assert abs(sum(mix.values()) - 1.0) < 1e-9 and not any(t == "edit" for t, _ in mix)
    scenario = SCENARIOS["sglang-pools"]
    observed = launched(scenario, World(), 0, mix=mix)[0].fleet
    even = launched(scenario, World(), 0)[0].fleet
    def ngram_workers(fleet) -> int:
        return sum(s.workers for s in fleet if s.method == "ngram")

    # the even mix counts an edit class nobody sends; the observed mix gives n-gram only
    # what the other classes want of it (since the step-law refit n-gram serves some of
    # them: 4 of 12 on seed 0, against 5 from the even mix; none before)
    assert ngram_workers(observed) < ngram_workers(even)
    assert sum(s.workers for s in observed) == sum(s.workers for s in even) == 12


def test_sglangs_tiers_tuned_from_the_benchmark_hold_its_best_k() -> None:
    bench = benchmark(SCENARIOS["sglang-pools"], World(), 0)
    tiers = tuned_tiers(bench, "eagle3")
    assert sorted(tiers) == sorted(SGLANG_ADAPTIVE)  # the same batch tiers, hysteresis
    assert all(tiers[key][1:] == SGLANG_ADAPTIVE[key][1:] for key in tiers)
    # each tier holds the k the benchmark favours at its batch (0: plain), not SGLang's
    for key, (candidates, _, _) in tiers.items():
        assert favoured_k(bench, "eagle3", key) in candidates
