"""`PolicyConfig.learning_unit`: acceptance learned per class (the default) or per pool
for every class at once, the request's pooled scale telling requests apart
(policies/learner.py `pooled`, policies/predictor.py `pooled_scales`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.config import ConfigError, parse_config
from policies.decision import Policy, PolicyConfig
from policies.learner import pooled_prior
from policies.predictor import Predictor
from policies.telemetry import LocalTelemetry
from policies.types import ANY_TASK, PoolView, RequestProfile, RequestRecord

CHAT = RequestProfile(task="chat", temperature=0.0, top_p=1.0, prompt_tokens=400,
                      max_tokens=256, stream=False, model="m")
EDIT = replace(CHAT, task="edit")
POOLS = [PoolView("ngram", "sglang", "ngram", 4, False, 2, 0),
         PoolView("plain", "sglang", "plain", 0, False, 2, 0)]


def _feed(policy: Policy, pool: str, task: str, accept_length: float, n: int,
          scale: float = 1.0) -> None:
    k, step_s = (0, 0.02) if pool == "plain" else (4, 0.03)
    for _ in range(n):
        policy.observe(RequestRecord(
            model="m", pool=pool, method=pool, k=k, task=task, temperature_bucket="t0",
            prompt_tokens=400, output_tokens=int(100 * accept_length), verify_steps=100,
            accept_length=accept_length, load=0, ttft_s=step_s, itl_s=step_s,
            e2e_s=100 * step_s,
            workers=2, timestamp=1.0, accept_scale=scale))


def _policy(unit: str) -> Policy:
    """Edits copy (n-gram 3 tokens a step), chat does not (1.2): 40 requests each; an
    n-gram step costs 1.5 plain ones."""
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                    PolicyConfig(explore_rate=0.0, learning_unit=unit))
    policy.decide(CHAT, POOLS)
    _feed(policy, "ngram", "edit", 3.0, 40)
    _feed(policy, "ngram", "chat", 1.2, 40)
    _feed(policy, "plain", "chat", 1.0, 40)
    policy.refit()
    return policy


def test_per_class_keeps_the_classes_apart_per_pool_pools_them() -> None:
    by_class, pooled = _policy("class").refit(), _policy("pool").refit()
    edit, chat = by_class.accept("m", "ngram", "edit", "t0"), by_class.accept("m", "ngram",
                                                                             "chat", "t0")
    assert edit[0] > chat[0] and edit[1] == chat[1] == pytest.approx(40)
    one = pooled.accept("m", "ngram", "edit", "t0")
    assert one == pooled.accept("m", "ngram", "chat", "t0") == pooled.accept(
        "m", "ngram", ANY_TASK, "t0")
    assert one[1] == pytest.approx(80) and chat[0] < one[0] < edit[0]  # both classes' requests behind it


def test_per_pool_the_pooled_scale_tells_requests_apart() -> None:
    """A chat request predicted to copy (pooled scale 2) and an edit predicted not to
    (0.5): per pool, the prediction moves them, not the class; per class it is read
    against the class's own mean (`drafter_scales`), which these profiles leave at 1."""
    policy = _policy("pool")
    copying = replace(CHAT, drafter_scales=(("ngram", 1.0),), pooled_scales=(("ngram", 4.0),))
    free = replace(EDIT, drafter_scales=(("ngram", 1.0),), pooled_scales=(("ngram", 0.25),))
    chosen = policy.decide(copying, POOLS)
    assert chosen.pool == "ngram" and chosen.accept_scale == 4.0  # the record divides it out
    assert policy.decide(free, POOLS).pool == "plain"
    by_class = _policy("class")
    assert by_class.decide(copying, POOLS).accept_scale == 1.0
    assert by_class.decide(free, POOLS).pool == "ngram"  # the edit class's 3 a step


def test_the_pooled_prior_is_the_mean_of_the_classes() -> None:
    prior = {("m", "ngram", "chat", "t0"): 0.2, ("m", "ngram", "edit", "t0"): 0.6,
             ("m", "eagle", "chat", "t0"): 0.5}
    assert pooled_prior(prior) == {("m", "ngram", ANY_TASK, "t0"): pytest.approx(0.4),
                                   ("m", "eagle", ANY_TASK, "t0"): 0.5}
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                    PolicyConfig(explore_rate=0.0, learning_unit="pool"))
    state = policy.learner.fit({}, prior)
    assert state.accept("m", "ngram", "code", "t0") == (pytest.approx(0.4), 0.0)


def test_pooled_scales_are_read_against_the_mean_of_every_request() -> None:
    document = {"features": ["a"], "k": 8,
                "class_mean": {"ngram": {"chat": 1.5, "edit": 3.0, ANY_TASK: 2.0}},
                "families": {"ngram": {"base": 1.0986123, "trees": []}}}  # predicts 3.0
    predicted, scales, pooled = Predictor(document).profile_fields("chat", [0.0])
    assert predicted == (("ngram", 3.0),)
    assert scales == (("ngram", 4.0),)  # 2 extra tokens against the class's 0.5
    assert pooled == (("ngram", 2.0),)  # against every request's 1
    del document["class_mean"]["ngram"][ANY_TASK]  # a file fitted before: the classes' mean
    assert Predictor(document).class_mean["ngram"][ANY_TASK] == 2.25


def test_the_learning_unit_is_a_checked_config_knob() -> None:
    base = {"pools": [{"name": "p", "engine": "sglang", "model": "m",
                       "workers": ["http://127.0.0.1:1"]}]}
    assert parse_config({**base, "policy": {"learning_unit": "pool"}}).policy.learning_unit \
        == "pool"
    assert parse_config(base).policy.learning_unit == "class"
    with pytest.raises(ConfigError, match="learning_unit"):
        parse_config({**base, "policy": {"learning_unit": "request"}})
