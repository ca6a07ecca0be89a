"""`Policy.predict` is the pure ranking `decide` builds on: explain uses it, so asking
why a request would go somewhere never moves counters, the RNG, exploration or cold-start
tries."""

from __future__ import annotations

from gateway.classifier.minimal import minimal_profile
from gateway.config import parse_config
from gateway.pins import Pin
from gateway.pools import build_pools
from gateway.routing.router import PoolRouter
from gateway.schemas import parse_request
from policies.protocol import Rule
from policies.types import Decision, PoolView, RequestProfile
from tests.policies.test_policy_decide import PROFILE, pools, trained


def test_predict_moves_nothing_that_decide_reads() -> None:
    asked, untouched = trained(explore=1.0), trained(explore=1.0)
    greedy = trained(explore=0.0).decide(PROFILE, pools())
    for _ in range(50):
        predicted = asked.predict(PROFILE, pools())
        assert predicted == greedy and not predicted.explored
    assert asked.explored_fraction == untouched.explored_fraction
    for _ in range(20):  # same RNG draws, same caps, same cold-start tries
        assert asked.decide(PROFILE, pools()) == untouched.decide(PROFILE, pools())


def test_explain_routes_with_predict_never_decide() -> None:
    config = parse_config({"pools": [{"name": "a", "engine": "sglang", "model": "m",
                                      "method": "eagle", "k": 3, "workers": ["http://a:1"]}]})
    built = build_pools(config)
    built["a"].workers[0].healthy = True

    def decide(_: RequestProfile, views: list[PoolView]) -> Decision:
        raise AssertionError("explain ran decide")

    def predict(_: RequestProfile, views: list[PoolView]) -> Decision:
        return Decision(pool="a", method="eagle", k=3, reason="predicted")

    policy = Rule(decide, "split")
    policy.predict = predict  # a policy whose pure ranking differs from its live pick
    router = PoolRouter(built, policy)
    request = parse_request({"model": "m", "prompt": "x"}, "completions")
    profile = minimal_profile(request, "t")
    decision, _ = router.route_assessed(router.assess(request, profile), profile, Pin(),
                                        explain=True)
    assert decision.reason == "predicted"


def test_a_ranking_is_memoised_per_load_slot_until_the_next_refit() -> None:
    """The greedy decision is a lookup for a request whose pools sit in the load slots of
    an earlier one's; another slot is ranked anew (and may rank differently), and a refit
    starts afresh; the memoised decision equals a fresh ranking's."""
    policy = trained()
    first = policy.decide(PROFILE, pools())
    assert policy.decide(PROFILE, pools()) is first  # same slots: the memo
    busy = policy.decide(PROFILE, pools(load=24))
    assert busy is not first and busy.predicted_tokens_per_s != first.predicted_tokens_per_s
    assert trained().decide(PROFILE, pools(load=24)) == busy  # a policy with no memo
    policy.refit()
    again = policy.decide(PROFILE, pools())
    assert again is not first and again == first  # re-ranked on the new state, same data
