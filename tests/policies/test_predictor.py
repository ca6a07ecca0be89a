"""The per-request drafter predictor at runtime (policies/predictor.py) and how the
policy uses it: the request's predicted scale moves the acceptance learned per (pool,
class), so two requests of one class can go to different drafters."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from policies.acceptance import method_accept_length
from policies.decision import Policy, PolicyConfig
from policies.predictor import (
    DEFAULT_PATH,
    Predictor,
    method_scale,
    quantise,
    ratio,
    scaled_accept,
)
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord

PROFILE = RequestProfile(task="edit", temperature=0.0, top_p=1.0, prompt_tokens=400,
                         max_tokens=256, stream=False, model="m")
POOLS = [PoolView("eagle", "sglang", "eagle", 4, False, 2, 0),
         PoolView("ngram", "sglang", "ngram", 4, False, 2, 0),
         PoolView("plain", "sglang", "plain", 0, False, 2, 0)]


def _feed(policy: Policy, pool: str, k: int, accept_length: float, step_s: float) -> None:
    for _ in range(40):
        policy.observe(RequestRecord(
            model="m", pool=pool, method=pool, k=k, task="edit", temperature_bucket="t0",
            prompt_tokens=400, output_tokens=int(100 * accept_length), verify_steps=100,
            accept_length=accept_length, load=0, ttft_s=step_s, itl_s=step_s,
            e2e_s=100 * step_s, workers=2, timestamp=1.0))


def _policy() -> Policy:
    """The class's acceptance: EAGLE a little ahead of n-gram at the same step cost."""
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                    PolicyConfig(explore_rate=0.0))
    policy.decide(PROFILE, POOLS)
    _feed(policy, "eagle", 4, 2.0, 0.022)
    _feed(policy, "ngram", 4, 1.9, 0.022)
    _feed(policy, "plain", 0, 1.0, 0.020)
    policy.refit()
    return policy


def test_a_request_predicted_to_copy_its_input_goes_to_the_ngram_pool() -> None:
    policy = _policy()
    copying = replace(PROFILE, drafter_scales=(("eagle", 1.0), ("ngram", 2.0)))
    free = replace(PROFILE, drafter_scales=(("eagle", 1.41), ("ngram", 0.5)))
    assert policy.decide(PROFILE, POOLS).pool == "eagle"  # no prediction: the class mean
    for _ in range(2):  # alternating: the memo keeps the two apart
        chosen = policy.decide(copying, POOLS)
        assert chosen.pool == "ngram"
        assert chosen.predicted_accept_length > 2.5  # 1 + 2 x the class's 0.9 extra tokens
        assert "2x its class's extra tokens" in chosen.reason
        assert chosen.accept_scale == 2.0  # what the record carries to learning
        assert policy.decide(free, POOLS).pool == "eagle"
    assert policy.predict(copying, POOLS).pool == "ngram"


def test_request_prediction_can_be_switched_off() -> None:
    policy = _policy()
    policy.config = replace(policy.config, request_prediction=False)
    copying = replace(PROFILE, drafter_scales=(("eagle", 1.0), ("ngram", 2.0)))
    decision = policy.predict(copying, POOLS)
    assert decision.pool == "eagle" and "its class's" not in decision.reason
    assert decision.accept_scale == 1.0


def test_scaled_acceptance_multiplies_extra_tokens_at_the_trace_k() -> None:
    for method in ("ngram", "eagle2"):  # a chain and a tree drafter
        a = 0.6
        for scale in (0.5, 1.0, 2.0):
            moved = scaled_accept(a, method, scale, 8)
            extra = method_accept_length(moved, method, 8) - 1.0
            assert extra == pytest.approx(scale * (method_accept_length(a, method, 8) - 1.0),
                                          rel=1e-6)
    assert scaled_accept(0.0, "ngram", 4.0, 8) == 0.0  # nothing accepted stays nothing


def test_scales_are_quantised_and_read_by_method_family() -> None:
    assert quantise(1.0) == 1.0
    assert quantise(1.3) == pytest.approx(2 ** 0.5)
    assert quantise(100.0) == 4.0 and quantise(0.0) == 0.25
    assert ratio(3.0, 2.0) == pytest.approx(2.0)  # extra tokens: 2 against 1
    scales = (("eagle", 0.5), ("ngram", 2.0))
    assert method_scale(scales, "ngram") == 2.0
    assert method_scale(scales, "eagle3") == 0.5 and method_scale(scales, "medusa") == 0.5
    assert method_scale(scales, "hybrid") == 1.0 and method_scale(scales, "plain") == 1.0
    assert method_scale((), "ngram") == 1.0


def test_the_shipped_predictor_loads_and_predicts_per_family() -> None:
    predictor = Predictor.load(DEFAULT_PATH)
    x = [0.0] * len(predictor.features)
    lengths = predictor.accept_lengths(x)
    assert set(lengths) == {"ngram", "eagle"}
    assert all(1.0 <= value <= predictor.k + 1 for value in lengths.values())
    scales = predictor.scales("edit", lengths)
    assert [family for family, _ in scales] == ["eagle", "ngram"]
    with pytest.raises(ValueError, match="features"):
        predictor.accept_lengths(x[:-1])


def test_explain_shows_the_prediction() -> None:
    profile = replace(PROFILE, predicted_accept=(("eagle", 1.3), ("ngram", 2.4)),
                      drafter_scales=(("eagle", 1.0), ("ngram", 2.0)))
    shown = profile.to_dict()
    assert shown["predicted"] == {"accept_length": {"eagle": 1.3, "ngram": 2.4},
                                  "scale": {"eagle": 1.0, "ngram": 2.0}, "pooled_scale": {}}
    assert "drafter_scales" not in shown


def _document(trees: list[dict]) -> dict:
    return {"features": ["a", "b"], "k": 8, "class_mean": {"ngram": {"chat": 2.0}},
            "families": {"ngram": {"base": 0.0, "trees": trees}}}


def test_trees_of_depth_two_are_unrolled_and_deeper_ones_refused() -> None:
    leaf = {"left": [-1], "right": [-1], "feature": [-2], "threshold": [-2.0],
            "value": [0.5]}
    stump = {"left": [1, -1, -1], "right": [2, -1, -1], "feature": [1, -2, -2],
             "threshold": [3.0, -2.0, -2.0], "value": [0.0, -1.0, 1.0]}
    uneven = {"left": [1, -1, 3, -1, -1], "right": [2, -1, 4, -1, -1],
              "feature": [0, -2, 1, -2, -2], "threshold": [0.0, -2.0, 5.0, -2.0, -2.0],
              "value": [0.0, 0.1, 0.0, 0.2, 0.3]}
    predictor = Predictor(_document([leaf, stump, uneven]))
    for x, leaves in (([0.0, 9.0], 0.5 + 1.0 + 0.1), ([1.0, 4.0], 0.5 + 1.0 + 0.2),
                      ([1.0, 6.0], 0.5 + 1.0 + 0.3), ([1.0, 2.0], 0.5 - 1.0 + 0.2)):
        assert predictor.accept_lengths(x)["ngram"] == pytest.approx(math.exp(leaves))
    deep = {"left": [1, 3, -1, 5, -1, -1, -1], "right": [2, 4, -1, 6, -1, -1, -1],
            "feature": [0, 0, -2, 0, -2, -2, -2], "threshold": [0.0] * 7, "value": [0.0] * 7}
    with pytest.raises(ValueError, match="deeper"):
        Predictor(_document([deep]))


def test_the_scale_a_decision_applied_is_divided_out_of_what_the_class_learns() -> None:
    """A request sent with a predicted scale of 2 that yielded 3 tokens a step teaches its
    class 2 a step (its extra tokens halved): a pool fed the requests the predictor scaled
    up learns the class's acceptance, not one its choice inflated. Its steps (the step
    cost) stay as measured; an unscaled request teaches what it saw."""
    from policies.aggregates import record_values
    from policies.types import RequestRecord

    def record(scale: float) -> RequestRecord:
        return RequestRecord(model="m", pool="ngram", method="ngram", k=8, task="chat",
                             temperature_bucket="t0", prompt_tokens=10, output_tokens=60,
                             verify_steps=20, accept_length=3.0, load=0, ttft_s=0.1,
                             itl_s=0.01, e2e_s=1.0, accept_scale=scale)

    scaled, plain = record_values(record(2.0)), record_values(record(1.0))
    assert (scaled["tokens"] / scaled["steps"], plain["tokens"] / plain["steps"]) == (2.0, 3.0)
    assert scaled["steps"] == plain["steps"] == 20 and scaled["decode_s"] == plain["decode_s"]
