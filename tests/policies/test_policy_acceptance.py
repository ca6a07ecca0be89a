"""Acceptance and step-cost estimators recover known parameters from synthetic telemetry."""

from __future__ import annotations

import numpy as np
import pytest

from bench.sim.simulator import sample_steps
from policies.acceptance import (
    A_MAX,
    draft_depth,
    expected_accept_length,
    invert_accept_length,
    method_accept_length,
)
from policies.cost import StepSample, fit_step_cost, generic_trend
from policies.learner import Learner, PolicyState
from policies.methods import TREE_DEPTH
from policies.options import evaluate
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestRecord


@pytest.mark.parametrize("a", [0.05, 0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 4, 10])
def test_inverse_round_trips(a: float, k: int) -> None:
    assert invert_accept_length(expected_accept_length(a, k), k) == pytest.approx(a, abs=1e-6)


def test_inverse_edges() -> None:
    assert invert_accept_length(1.0, 5) == 0.0  # nothing accepted
    assert invert_accept_length(0.7, 5) == 0.0  # below the floor: clamp, not crash
    assert invert_accept_length(6.0, 5) == A_MAX  # everything accepted
    assert invert_accept_length(9.0, 5) == A_MAX
    assert invert_accept_length(3.0, 0) == 0.0
    assert expected_accept_length(0.9, 0) == 1.0


def _record(a: float, k: int, task: str, rng: np.random.Generator, method: str = "eagle3",
            t: float = 1.0, load: int = 0, step_s: float = 0.02) -> RequestRecord:
    tokens = int(rng.integers(64, 256))
    steps = sample_steps(rng, a, k, tokens)
    return RequestRecord(model="m", pool=method, method=method, k=k, task=task,
                         temperature_bucket="t0", prompt_tokens=100, output_tokens=tokens,
                         verify_steps=steps, accept_length=tokens / steps, load=load,
                         ttft_s=step_s, itl_s=step_s, e2e_s=steps * step_s, timestamp=t)


@pytest.mark.parametrize("true_a", [0.4, 0.75, 0.92])
def test_learner_recovers_acceptance_from_accept_lengths(true_a: float) -> None:
    rng = np.random.default_rng(1)
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    for i in range(300):
        store.record(_record(true_a, (2, 4, 8)[i % 3], "code", rng))
    a, n = Learner().fit(store.snapshot()).accept("m", "eagle3", "code", "t0")
    assert n == pytest.approx(300, rel=1e-6)
    assert a == pytest.approx(true_a, abs=0.03)


def test_step_cost_recovers_a_linear_truth_per_load() -> None:
    def truth(k: int, load: float) -> float:
        return 0.015 * (1 + load / 48) + k * (0.001 + 0.0003 * load)

    samples = [StepSample(k, load, truth(k, load), 20.0, slot)
               for slot, load in ((1, 1.5), (4, 5.0), (16, 20.0))
               for k in (0, 2, 4, 6, 8)]
    cost, _ = fit_step_cost(samples, generic_trend(0.015))
    for load in (1.5, 5.0, 20.0):
        for k in (0, 4, 8):
            assert cost.step_s(k, load) == pytest.approx(truth(k, load), rel=0.05)


def _batch_record(own_k: int, batch: float, batch_k: float | None,
                  step_s: float) -> RequestRecord:
    steps = 40
    return RequestRecord(model="m", pool="p", method="eagle", k=own_k, task="code",
                         temperature_bucket="t0", prompt_tokens=100, output_tokens=2 * steps,
                         verify_steps=steps, accept_length=2.0, load=3, ttft_s=step_s,
                         itl_s=step_s, e2e_s=steps * step_s, timestamp=1.0,
                         batch=batch if batch_k is not None else None,
                         batch_draft_tokens=batch * batch_k if batch_k is not None else None)


@pytest.mark.parametrize("reported", [True, False])
def test_step_cost_is_fitted_on_the_batch_draft_tokens_the_worker_reports(
        reported: bool) -> None:
    """A step costs what its whole batch drafts: requests at k = 0, 2, 4 and 8, each in a
    batch of 4 whose three others drafted 3 tokens each. With the worker's report the fit
    recovers the batch-wide cost per draft token (what every request pays when the whole
    batch drafts more); on the request's own k it reads a quarter of it (one request's
    share of the step), and a pool whose whole batch goes to k = 8 would be predicted
    far too fast."""
    def truth(batch_k: float) -> float:
        return 0.02 + 0.004 * batch_k

    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    for own_k in (0, 2, 4, 8):
        batch_k = (3 * 3.0 + own_k) / 4
        for _ in range(30):
            store.record(_batch_record(own_k, 4.0, batch_k if reported else None,
                                       truth(batch_k)))
    cost = Learner().fit(store.snapshot()).cost("p")
    slope = (cost.step_s(8.0, 4.0) - cost.step_s(0.0, 4.0)) / 8.0
    assert slope == pytest.approx(0.004 if reported else 0.001, rel=0.25)
    if reported:
        assert cost.step_s(8.0, 4.0) == pytest.approx(truth(8.0), rel=0.1)

def test_prompt_lookup_batch_draft_tokens_compare_with_its_own_drafts_not_k() -> None:
    """n-gram at k = 6 verifies about one token a step: a batch of such requests drafts
    like the request itself, so the cost fit sees the batch at k = 6 (the policy's terms),
    not at 1; a batch whose mates drafted 3 more each reads that much above k."""
    from policies.aggregates import batch_dk

    rec = _batch_record(6, 4.0, 1.1, 0.03)
    rec.own_draft_tokens = 1.1
    assert batch_dk(rec) == pytest.approx(0.0)
    rec.batch_draft_tokens = 1.1 + 3 * 4.1  # three mates at 4.1 each
    assert batch_dk(rec) == pytest.approx((1.1 + 3 * 4.1) / 4 - 1.1)
    rec.own_draft_tokens = None  # a worker that did not count its own: k stands in
    assert batch_dk(rec) == pytest.approx((1.1 + 3 * 4.1) / 4 - 6)

def _tree_record(a: float, k: int, depth: int, rng: np.random.Generator) -> RequestRecord:
    tokens = int(rng.integers(64, 256))
    steps = sample_steps(rng, a, min(k, depth), tokens)  # the tree accepts at most `depth`
    return RequestRecord(model="m", pool="eagle2", method="eagle2", k=k, task="code",
                         temperature_bucket="t0", prompt_tokens=100, output_tokens=tokens,
                         verify_steps=steps, accept_length=tokens / steps, load=0,
                         ttft_s=0.02, itl_s=0.02, e2e_s=steps * 0.02, timestamp=1.0)


def test_tree_accept_length_stops_at_its_depth() -> None:
    depth = TREE_DEPTH["eagle2"]
    assert method_accept_length(0.8, "eagle2", 12) == expected_accept_length(0.8, depth)
    assert method_accept_length(0.8, "eagle2", 2) == expected_accept_length(0.8, 2)
    assert method_accept_length(0.8, "eagle", 12) == expected_accept_length(0.8, 12)
    assert draft_depth("medusa", 9, {"medusa": 7}) == 7


def test_learner_inverts_tree_telemetry_at_the_trees_depth() -> None:
    rng = np.random.default_rng(2)
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    for i in range(300):
        store.record(_tree_record(0.8, (2, 4, 8, 12)[i % 4], TREE_DEPTH["eagle2"], rng))
    state = Learner().fit(store.snapshot())
    a, _ = state.accept("m", "eagle2", "code", "t0")
    assert a == pytest.approx(0.8, abs=0.03)  # the chain law at k would read ~0.6
    assert state.depths["eagle2"] == TREE_DEPTH["eagle2"]
    assert state.accept_length(a, "eagle2", 12) == pytest.approx(state.accept_length(a, "eagle2", 5))


def test_learner_raises_a_tree_depth_that_telemetry_proves_deeper() -> None:
    rng = np.random.default_rng(3)
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    for _ in range(40):
        store.record(_tree_record(0.99, 10, 9, rng))  # mean accept length ~9 > depth 5 + 1
    assert Learner().fit(store.snapshot()).depths["eagle2"] >= 8


def _state_with_cost(per_token: float, others: float) -> PolicyState:
    from policies.cost import StepCost

    cost = StepCost((1.0, 64.0), (0.02, 0.02), (per_token, per_token))
    return PolicyState(acceptance={("m", "eagle", "code", "t0"): (0.8, 100.0)},
                       costs={"p": cost}, pool_accept_length={"p": 3.0})


def test_a_busy_worker_gets_a_smaller_k_than_an_idle_one() -> None:
    """The batch gain counts the slowdown a request's drafts impose on its batch-mates:
    alone on a worker it takes the k that is best for itself; among 16 it drafts less."""
    pool = PoolView("p", "embedded", "eagle", 4, True, 1, 0, 12)
    state = _state_with_cost(0.001, 3.0)
    alone = evaluate(state, pool, "m", "code", "t0", 1.0)
    busy = evaluate(state, pool, "m", "code", "t0", 16.0)
    selfish = evaluate(state, pool, "m", "code", "t0", 16.0, batch_aware=False)
    assert alone.k == selfish.k > busy.k
    assert busy.pool_score == selfish.tokens_per_s  # pools are still ranked on one footing


def test_plain_decoding_on_a_drafting_pool_pays_for_its_batch_mates() -> None:
    """A request at k = 0 on the EAGLE pool shares its steps with requests drafting 4
    tokens each (what that pool's telemetry says): at 4 per worker it is predicted slower
    than the same request on the plain pool, so `no speculation` goes to the plain pool."""
    from policies.cost import StepCost
    from policies.options import make_option

    cost = StepCost((1.0, 64.0), (0.02, 0.02), (0.005, 0.005))
    state = PolicyState(costs={"eagle": cost, "plain": cost}, pool_draft_k={"eagle": 4.0})
    eagle = PoolView("eagle", "embedded", "eagle", 4, True, 1, 3, 8)
    plain = PoolView("plain", "embedded", "plain", 0, True, 1, 3, 0)
    on_eagle = make_option(state, eagle, 0, 0.5, 0.0, 4.0)
    on_plain = make_option(state, plain, 0, 0.5, 0.0, 4.0)
    assert on_eagle.tokens_per_s == pytest.approx(1 / (0.02 + 0.005 * 3.0))
    assert on_plain.tokens_per_s == pytest.approx(1 / 0.02)
    alone = make_option(state, eagle, 0, 0.5, 0.0, 1.0)  # nobody to share a step with
    assert alone.tokens_per_s == pytest.approx(1 / 0.02)


def test_scored_is_replace_of_the_pool_score_alone() -> None:
    """`scored` spells out `dataclasses.replace` (a compiled constructor call): every
    field but `pool_score` carried over, a field added to `Option` included."""
    import dataclasses

    from policies.options import Option, scored

    pool = PoolView("p", "sglang", "eagle", 3, True, 1, 0)
    values = {field.name: index + 1.5 for index, field in enumerate(dataclasses.fields(Option))}
    option = Option(**{**values, "pool": pool, "k": 2})
    assert scored(option, 9.25) == dataclasses.replace(option, pool_score=9.25)
