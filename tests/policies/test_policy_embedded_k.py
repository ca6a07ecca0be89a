"""The per-request-k pools' choice of k (issue 22, the `embedded` fleet): k by what the
mixed batch emits, acceptance read along its slope in k, and the fresh view of
acceptance that notices a drift within seconds (docs/POLICY.md, "How k is chosen")."""

from __future__ import annotations

import pytest

from policies.acceptance import expected_accept_length, invert_accept_length
from policies.aggregates import ContextKey, ContextStats
from policies.cost import StepCost
from policies.kslope import tilted_accept
from policies.learner import Learner, PolicyState
from policies.options import evaluate, mixed_batch
from policies.types import PoolView

POOL = PoolView("ngram", "embedded", "ngram", 4, True, 1, 0, 12)
KEY = ("m", "ngram", "edit", "t0")
GROUPS = {"ngram": "engine:embedded"}


def _busy_state(share: float) -> PolicyState:
    # 32 requests a worker; a draft token costs 20% of a step; the batch drafts 3 tokens
    # a request and emits 3 a step; the edit accepts a = 0.9
    cost = StepCost((1.0, 64.0), (0.05, 0.05), (0.01, 0.01))
    return PolicyState(acceptance={KEY: (0.9, 100.0)}, costs={"ngram": cost},
                       cost_measured=frozenset({"ngram"}), pool_draft_k={"ngram": 3.0},
                       group_accept_length={"ngram": 3.0},
                       batch_share={("ngram", "m", "edit", "t0"): share})


def test_a_small_share_of_a_busy_batch_drafts_deeper_than_the_whole_batch_rule() -> None:
    """The whole-batch rule weighs a deeper k against what the edit itself emits (5-6
    tokens a step); as 5% of a batch whose other requests emit 3, the step it slows
    carries fewer tokens, so a deeper k pays. The pool is still scored by the request's
    own tokens/s at the whole-batch k."""
    whole = evaluate(_busy_state(1.0), POOL, "m", "edit", "t0", 32.0, mix=False)
    mixed = evaluate(_busy_state(0.05), POOL, "m", "edit", "t0", 32.0, mix=True)
    assert mixed.k > whole.k
    assert mixed.pool_score == pytest.approx(whole.tokens_per_s)


def test_the_mixed_batch_at_share_one_is_the_whole_batch_rule() -> None:
    state = _busy_state(1.0)
    whole = evaluate(state, POOL, "m", "edit", "t0", 32.0, mix=False)
    mixed = mixed_batch(state, POOL, range(13), 0.9, 100.0, 32.0, 1.0)
    assert mixed.k == whole.k


def _stats(length: float, steps: float, requests: float) -> ContextStats:
    return ContextStats(n=requests, known=requests, steps=steps, tokens=length * steps,
                        decode_s=0.0, load=requests, lifetime_known=requests)


def _name(k: int, pool: str = "ngram") -> str:
    return ContextKey("m", pool, "ngram", k, "edit", "t0", 1).encode()


def test_acceptance_that_rises_with_k_is_read_at_the_k_asked() -> None:
    """a inverted at k 4 is 0.90 and at k 8 0.95 (an accepted run tends to continue):
    the learner fits a positive slope, and E at k 12 exceeds the i.i.d. reading."""
    a4, a8 = 0.90, 0.95
    snapshot = {_name(4): _stats(expected_accept_length(a4, 4), 500.0, 20.0),
                _name(8): _stats(expected_accept_length(a8, 8), 500.0, 20.0)}
    state = Learner().fit(snapshot, groups=GROUPS, clock=(10.0, 300.0))
    slope, centre = state.accept_tilt[KEY]
    assert slope > 0.3
    a, _ = state.accept("m", "ngram", "edit", "t0")
    assert state.accept_length(a, "ngram", 12, state.accept_tilt[KEY]) > (
        state.accept_length(a, "ngram", 12) + 0.5)
    assert tilted_accept(a, 8, (slope, centre)) > tilted_accept(a, 4, (slope, centre))


def test_one_k_or_no_clock_fits_no_slope() -> None:
    one = {_name(6): _stats(5.0, 500.0, 20.0)}
    assert Learner().fit(one, groups=GROUPS, clock=(10.0, 300.0)).accept_tilt == {}
    two = {_name(4): _stats(4.0, 500.0, 20.0), _name(8): _stats(7.0, 500.0, 20.0)}
    assert Learner().fit(two, groups=GROUPS).accept_tilt == {}


def _drift_run(pool: str, groups: dict[str, str]) -> tuple[Learner, list[PolicyState]]:
    """60 s at accept length 5 at k 6, then 10 s at 2.5 (a drift), 5 requests a second:
    the telemetry's long and recent views still hold mostly the old figure."""
    learner = Learner()
    states = []
    fade, fast = 2.718281828 ** (-1 / 300), 2.718281828 ** (-1 / 60)
    long_steps = recent_steps = 0.0
    long_tokens = recent_tokens = 0.0
    long_n = recent_n = 0.0
    for t in range(1, 71):
        length, n = (5.0, 5.0) if t <= 60 else (2.5, 5.0)
        steps = 40.0 * n
        long_steps, recent_steps = long_steps * fade + steps, recent_steps * fast + steps
        long_tokens = long_tokens * fade + steps * length
        recent_tokens = recent_tokens * fast + steps * length
        long_n, recent_n = long_n * fade + n, recent_n * fast + n
        recent = ContextStats(n=recent_n, known=recent_n, steps=recent_steps,
                              tokens=recent_tokens, load=recent_n)
        stats = ContextStats(n=long_n, known=long_n, steps=long_steps, tokens=long_tokens,
                             load=long_n, recent=recent, lifetime_known=5.0 * t)
        snapshot = {ContextKey("m", pool, "ngram", 6, "edit", "t0", 1).encode(): stats}
        states.append(learner.fit(snapshot, groups=groups, clock=(float(t), 300.0)))
    return learner, states


def test_the_fresh_view_notices_a_drift_within_seconds() -> None:
    """10 s after the drift the estimate on a per-request-k pool is nearer the new
    figure than the old; the telemetry's views alone (a fixed-k pool) are not."""
    _, states = _drift_run("ngram", GROUPS)
    old, new = invert_accept_length(5.0, 6), invert_accept_length(2.5, 6)
    assert states[59].accept(*KEY)[0] == pytest.approx(old, abs=0.01)
    after = states[-1].accept(*KEY)[0]
    assert after < (old + new) / 2
    _, fixed = _drift_run("vllm-ngram", {})
    assert fixed[-1].accept(*KEY)[0] > after + 0.05


def test_the_fresh_view_leaves_fixed_k_pools_to_the_telemetrys_views() -> None:
    """On fixed-k pools (not in `groups`) the estimate moves only as the recent view
    does: there the fresh view moved requests between pools sooner and cost the
    simulator's fine-tuned phase (docs/results/2026-12-02-embedded-k.md)."""
    _, states = _drift_run("vllm-ngram", {})
    after = states[-1].accept(*KEY)[0]
    assert after > invert_accept_length(3.5, 6)  # still near the old 5 tokens a step


def test_no_slope_is_fitted_for_a_context_that_drifted() -> None:
    """After a drift a context's k's mix two regimes (the old a at the old k), which
    reads as a slope: the learner holds its slope back for the telemetry's time constant."""
    learner, states = _drift_run("ngram", GROUPS)
    two_ks = {_name(6): _stats(2.5, 500.0, 20.0), _name(10): _stats(5.0, 500.0, 20.0)}
    held = learner.fit(two_ks, groups=GROUPS, clock=(100.0, 300.0))
    assert KEY not in held.accept_tilt
    fresh = Learner().fit(two_ks, groups=GROUPS, clock=(100.0, 300.0))
    assert KEY in fresh.accept_tilt
