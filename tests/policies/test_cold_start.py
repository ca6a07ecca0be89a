"""Cold-start tries (policies/cold_start.py): per class for speculative pools, once per
plain pool, never on a pool no outcome could make the pick."""

from __future__ import annotations

from policies.cold_start import ColdStart
from policies.decision import Policy, PolicyConfig
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord


def profile(task: str) -> RequestProfile:
    return RequestProfile(task=task, temperature=0.0, top_p=1.0, prompt_tokens=200,  # type: ignore[arg-type]
                          max_tokens=64, stream=False, model="m")


POOLS = [PoolView("ngram", "sglang", "ngram", 4, False, 1, 0),
         PoolView("plain", "sglang", "plain", 0, False, 1, 0)]


def record(pool: str, method: str, k: int, task: str, tokens: int, steps: int,
           now: float) -> RequestRecord:
    return RequestRecord(model="m", pool=pool, method=method, k=k, task=task,
                         temperature_bucket="t0", prompt_tokens=200, output_tokens=tokens,
                         verify_steps=steps, accept_length=tokens / steps, load=0,
                         ttft_s=0.01, itl_s=0.01, e2e_s=0.01 * steps, timestamp=now)


def test_plain_is_tried_once_speculative_pools_per_class() -> None:
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                    PolicyConfig(explore_rate=0.02, explore_cap=1.0, cold_start_samples=2))
    tried = []
    for task in ("code", "chat", "edit"):
        for _ in range(6):
            decision = policy.decide(profile(task), POOLS)
            if decision.explored:
                tried.append((task, decision.pool))
    assert [t for t in tried if t[1] == "plain"] == [("code", "plain")]
    for task in ("code", "chat", "edit"):
        assert tried.count((task, "ngram")) == 2


def test_a_pool_no_try_could_make_the_pick_is_not_tried() -> None:
    clock = [1.0]
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: clock[0]),
                    PolicyConfig(explore_rate=0.02, explore_cap=1.0))
    pools = [*POOLS, PoolView("eagle", "sglang", "eagle", 2, False, 1, 0)]
    policy.decide(profile("edit"), pools)
    for _ in range(30):  # n-gram copies edits (5 tokens a step); eagle is slow at k 2
        policy.observe(record("ngram", "ngram", 4, "edit", 200, 40, clock[0]))
        policy.observe(record("eagle", "eagle", 2, "chat", 120, 100, clock[0]))
        policy.observe(record("plain", "plain", 0, "chat", 100, 100, clock[0]))
        clock[0] += 0.1
    state = policy.refit()
    ranked = policy._rank(*policy._current, profile("edit"), pools)  # noqa: SLF001
    assert ranked.chosen.pool.name == "ngram"
    eagle = next(o for o in ranked.options if o.pool.name == "eagle")
    tries = ColdStart(3, PolicyConfig().ucb_z, 1.0)
    # eagle at most 3 tokens a step (k 2) against n-gram's 5: no outcome makes it the pick
    assert tries.hopeful(eagle, state) <= ranked.chosen.pool_score
    assert tries.pick(ranked.options, state, ("m", "edit", "t0"), ranked.chosen) is None
