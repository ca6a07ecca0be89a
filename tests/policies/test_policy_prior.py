"""The policy starts from what workers measured about themselves (measured.json, or an
SGLang server's average accept length), and from a flat prior — the same for every
method, never a hand-written ordering — where nothing was measured."""

from __future__ import annotations

import json

import pytest

from policies.acceptance import expected_accept_length
from policies.decision import Policy, PolicyConfig
from policies.options import evaluate, make_option
from policies.prior import Measured, MeasuredError, WorkerPrior
from policies.telemetry import LocalTelemetry
from policies.types import TASKS, PoolView, RequestProfile, RequestRecord
from tests.policies.test_policy_decide import PROFILE

CHAT = RequestProfile(task="chat", temperature=0.8, top_p=1.0, prompt_tokens=50,
                      max_tokens=64, stream=False, model="m")


def entry(method: str, k: int, task: str, temperature: float, a: float, speedup: float,
          requests: int = 6) -> dict:
    return {"method": method, "k": k, "task": task, "temperature": temperature,
            "accept_length": round(expected_accept_length(a, k), 4), "tokens_per_s": 20.0,
            "speedup": speedup, "requests": requests}


# Hand-made: n-gram wins greedy code (input-grounded), EAGLE wins chat at T 0.8.
MEASURED = {"model": "m", "source": "hand-made for the test", "measured_at": "2026-11-30",
            "device": "cpu", "entries": [
                entry("ngram", 6, "code", 0.0, 0.85, 2.9),
                entry("ngram", 6, "chat", 0.8, 0.15, 0.95),
                entry("eagle", 4, "code", 0.0, 0.55, 1.5),
                entry("eagle", 4, "chat", 0.8, 0.65, 1.7)]}


def pools() -> list[PoolView]:
    return [PoolView("eagle", "embedded", "eagle", 4, True, 1, 0, 8),
            PoolView("ngram", "embedded", "ngram", 6, True, 1, 0, 8),
            PoolView("plain", "embedded", "plain", 0, False, 1, 0, 0)]


def policy_with(measured: dict | None) -> Policy:
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                    PolicyConfig(explore_rate=0.0))
    if measured is not None:
        doc = Measured.from_dict(json.loads(json.dumps(measured)))
        for method in ("eagle", "ngram"):
            policy.set_worker_prior(method, WorkerPrior.from_measured("m", method, doc))
    policy.refit()
    return policy


def test_measured_prior_routes_each_class_before_any_telemetry() -> None:
    policy = policy_with(MEASURED)
    assert policy.predict(PROFILE, pools()).pool == "ngram"  # code, greedy
    assert policy.predict(CHAT, pools()).pool == "eagle"  # chat, T 0.8
    a, n = policy.state.accept("m", "ngram", "code", "t0")
    assert a == pytest.approx(0.85, abs=1e-3) and n == 0.0
    # a class the run did not cover takes the task's measured buckets
    assert policy.state.accept("m", "ngram", "code", "tlow")[0] == pytest.approx(0.85, abs=1e-3)


def test_no_measurement_is_a_flat_prior_not_an_ordering() -> None:
    state = policy_with(None).state
    values = {state.accept("m", method, task, "t0")[0]
              for method in ("eagle3", "eagle2", "eagle", "medusa", "draft", "ngram",
                             "lookahead") for task in ("code", "chat")}
    assert values == {0.5}


def test_telemetry_outweighs_the_prior() -> None:
    policy = policy_with(MEASURED)
    for _ in range(200):  # n-gram turns out poor on this fleet's greedy code
        steps = 100
        policy.observe(RequestRecord(
            model="m", pool="ngram", method="ngram", k=6, task="code", temperature_bucket="t0",
            prompt_tokens=50, output_tokens=int(steps * expected_accept_length(0.2, 6)),
            verify_steps=steps, accept_length=0.0, load=0, ttft_s=0.01, itl_s=0.01,
            e2e_s=steps * 0.01, timestamp=1.0))
    policy.refit()
    assert policy.state.accept("m", "ngram", "code", "t0")[0] < 0.25


def test_server_average_is_a_method_level_prior() -> None:
    prior = WorkerPrior.from_server_average("m", "eagle3", expected_accept_length(0.7, 3), 3)
    assert all(a == pytest.approx(0.7, abs=1e-6) for a in prior.acceptance.values())
    assert len(prior.acceptance) == len(TASKS) * 3  # every task x temperature bucket


def test_relative_draft_cost_from_speedup() -> None:
    doc = Measured.from_dict({**MEASURED, "entries": [entry("eagle", 4, "code", 0.0, 0.7, 1.0)]})
    c = WorkerPrior.from_measured("m", "eagle", doc).draft_cost
    assert c == pytest.approx((expected_accept_length(0.7, 4) / 1.0 - 1) / 4, rel=1e-3)


@pytest.mark.parametrize(("change", "field"), [
    ({"entries": "x"}, "measured.entries"),
    ({"model": 3}, "measured.model"),
    ({"entries": [{**entry("eagle", 4, "code", 0.0, 0.7, 1.0), "task": "math"}]},
     "measured.entries[0].task"),
    ({"entries": [{**entry("eagle", 4, "code", 0.0, 0.7, 1.0), "k": "4"}]},
     "measured.entries[0].k"),
])
def test_measured_schema_errors_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(MeasuredError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Measured.from_dict({**MEASURED, **change})


def test_shipped_tiny_measurement_parses() -> None:
    from workers.models import BUNDLED_MODEL_DIR

    doc = Measured.from_dict(json.loads((BUNDLED_MODEL_DIR / "measured.json").read_text()))
    assert doc.model == "specroute-tiny" and doc.entries
    assert WorkerPrior.from_measured(doc.model, "eagle", doc).acceptance


def test_measured_draft_cost_starts_the_pool_step_cost() -> None:
    policy = policy_with(MEASURED)
    expected = WorkerPrior.from_measured("m", "eagle", Measured.from_dict(MEASURED)).draft_cost
    cost = policy.state.cost("eagle")
    assert expected is not None
    assert cost.per_token[0] / cost.base[0] == pytest.approx(expected, rel=0.05)
    generic = policy.state.cost("plain")  # no measurement: the fleet's generic 5%
    assert generic.per_token[0] / generic.base[0] == pytest.approx(0.05, rel=0.05)


def served(pool: str, method: str, k: int, steps: int, step_s: float, n: int = 30
           ) -> list[RequestRecord]:
    """n requests of 64 tokens in `steps` verify steps of `step_s` seconds each."""
    return [RequestRecord(model="m", pool=pool, method=method, k=k, task="code",
                          temperature_bucket="t0", prompt_tokens=40, output_tokens=64,
                          verify_steps=steps, accept_length=64 / steps, load=0, ttft_s=0.1,
                          itl_s=step_s, e2e_s=0.1 + (steps - 1) * step_s, timestamp=1.0)
            for _ in range(n)]


def test_predictions_match_the_shipped_measurement_after_a_few_requests() -> None:
    """SmolLM2's measured.json as the workers' prior, then a few requests per pool that
    agree with it: every pool's predicted speedup over plain at its measured k stays near
    the measured one (a speculative pool measured at 0.86x plain once read "1.7x")."""
    from workers.models import weights_dir

    doc = Measured.from_dict(json.loads(
        (weights_dir("smollm2-135m-instruct") / "measured.json").read_text()))
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0), PolicyConfig(explore_rate=0.0))
    methods = sorted({e.method for e in doc.entries if e.k > 0})
    for method in methods:
        policy.set_worker_prior(method, WorkerPrior.from_measured("m", method, doc))
    plain_step = 0.09
    for e in doc.entries:
        if e.task == "code" and e.temperature == 0.0:
            steps = max(round(64 / e.accept_length), 1)
            step = plain_step * e.accept_length / e.speedup if e.k > 0 else plain_step
            for rec in served(e.method, e.method, e.k, steps, step, n=3):
                policy.observe(rec)
    policy.refit()
    state = policy.state
    plain = PoolView("plain", "embedded", "plain", 0, False, 1, 0, 0)
    plain_tps = evaluate(state, plain, "m", "code", "t0", 1.0, top_k=0,
                                 batch_aware=False).tokens_per_s
    for e in doc.entries:  # a method measured at several k: each k against its figure
        if e.task == "code" and e.temperature == 0.0 and e.k > 0:
            view = PoolView(e.method, "embedded", e.method, e.k, True, 1, 0, 8)
            predicted = make_option(state, view, e.k,
                                    state.accept("m", e.method, "code", "t0")[0], 0.0, 1.0)
            assert predicted.tokens_per_s / plain_tps == pytest.approx(e.speedup, rel=0.15), e


def test_shipped_smollm2_prior_sends_greedy_edits_to_ngram() -> None:
    """What SmolLM2's workers measured (n-gram 2.05x plain on greedy edits, accept length
    4.6) routes an edit to n-gram from the first request, before any telemetry."""
    from policies.methods import DEFAULT_K
    from workers.models import weights_dir

    doc = Measured.from_dict(json.loads(
        (weights_dir("smollm2-135m-instruct") / "measured.json").read_text()))
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0), PolicyConfig(explore_rate=0.0))
    methods = ("ngram", "medusa", "eagle", "eagle2")
    for method in methods:
        policy.set_worker_prior(method, WorkerPrior.from_measured("m", method, doc))
    policy.refit()
    pools = [PoolView(m, "embedded", m, DEFAULT_K[m], True, 1, 0, 8) for m in methods]
    pools.append(PoolView("plain", "embedded", "plain", 0, False, 1, 0, 0))
    edit = RequestProfile(task="edit", temperature=0.0, top_p=1.0, prompt_tokens=120,
                          max_tokens=64, stream=False, model="m")
    decision = policy.predict(edit, pools)
    assert decision.pool == "ngram" and decision.k > 0, decision


def cost(method: str, k: int, batch: int, step_ms: float, steps: int = 24) -> dict:
    return {"method": method, "k": k, "batch": batch, "step_s": step_ms / 1000, "steps": steps}


# A worker whose drafts are nearly free alone and dear in a batch of 4: plain 10 ms at
# batch 1, 12 ms at 4; EAGLE +0.5 ms per draft token at 1, +3 ms at 4 (exact lines).
COSTS = [cost("plain", 0, 1, 10.0), cost("plain", 0, 4, 12.0),
         *[cost("eagle", k, 1, 10.0 + 0.5 * k) for k in (1, 2, 4)],
         *[cost("eagle", k, 4, 12.0 + 3.0 * k) for k in (1, 2, 4)]]


def test_measured_step_curve_is_relative_to_plain_at_batch_one() -> None:
    doc = Measured.from_dict({**MEASURED, "costs": COSTS})
    assert Measured.from_dict(doc.to_dict()) == doc
    curve = WorkerPrior.from_measured("m", "eagle", doc).step_curve
    assert [(p.batch, p.base, p.per_token) for p in curve] == [
        pytest.approx((1.0, 1.0, 0.05)), pytest.approx((4.0, 1.2, 0.3))]
    assert WorkerPrior.from_measured("m", "ngram", doc).step_curve == ()  # not measured
    assert WorkerPrior.from_measured("m", "eagle", Measured.from_dict(MEASURED)).step_curve == ()


@pytest.mark.parametrize(("change", "field"), [
    ({"costs": {}}, "measured.costs"),
    ({"costs": [{**cost("eagle", 2, 1, 10.0), "batch": 0}]}, "measured.costs[0]"),
    ({"costs": [{**cost("eagle", 2, 1, 10.0), "step_s": "fast"}]}, "measured.costs[0].step_s"),
])
def test_measured_costs_errors_name_the_field(change: dict, field: str) -> None:
    with pytest.raises(MeasuredError, match=field.replace("[", r"\[").replace("]", r"\]")):
        Measured.from_dict({**MEASURED, **change})


def test_fit_keeps_the_measured_fraction_where_traffic_never_varies_k() -> None:
    """Every request at k = 4 on one load: traffic alone cannot tell base from per-token
    cost; the measured fraction (0.3 of plain's step at batch 4) settles it, and the
    fitted step still matches what traffic shows."""
    from policies.cost import StepSample, curve_ratios, fit_step_cost, generic_trend

    samples = [StepSample(4, 4.0, 0.024, 30.0, 4)]
    ratios = curve_ratios([(1.0, 1.0, 0.05, 0.0), (4.0, 1.2, 0.3, 0.0)])
    fitted, _ = fit_step_cost(samples, generic_trend(0.01), ratios=ratios)
    base, per_token = fitted.step_s(0, 4.0), fitted.step_s(1, 4.0) - fitted.step_s(0, 4.0)
    assert per_token / base == pytest.approx(0.25, rel=0.1)  # 0.3 / 1.2
    assert fitted.step_s(4, 4.0) == pytest.approx(0.024, rel=0.05)
    plain, _ = fit_step_cost(samples, generic_trend(0.01))
    assert (plain.step_s(1, 4.0) - plain.step_s(0, 4.0)) / plain.step_s(0, 4.0) < 0.15


def test_measured_batch_costs_make_a_busy_worker_draft_less() -> None:
    """With the batch benchmark, k is the one best for the whole batch at it: alone the
    drafts cost 5% of a step and EAGLE goes deep; in a batch of 4 each costs 25% and the
    same request drafts less."""
    doc = {**MEASURED, "costs": COSTS}
    policy = policy_with(doc)
    assert "eagle" in policy.state.cost_measured
    pool = PoolView("eagle", "embedded", "eagle", 4, True, 1, 0, 8)
    alone = evaluate(policy.state, pool, "m", "code", "t0", 1.0)
    busy = evaluate(policy.state, pool, "m", "code", "t0", 4.0)
    assert alone.k > busy.k >= 0
    unmeasured = policy_with(MEASURED)
    assert "eagle" not in unmeasured.state.cost_measured


def test_the_batch_workers_report_counts_as_load_this_gateway_does_not_see() -> None:
    """Another gateway keeps the EAGLE worker at a batch of 4: this gateway has nothing
    in flight there, but the pool's latest report says 4, so it drafts as for a busy
    worker; with the report off (or faded to 1) it drafts as for an idle one."""
    picks = {}
    for reported, batch in ((True, 4.0), (False, 4.0), (True, 1.0)):
        policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                        PolicyConfig(explore_rate=0.0, reported_load=reported))
        doc = Measured.from_dict({**MEASURED, "costs": COSTS})
        policy.set_worker_prior("eagle", WorkerPrior.from_measured("m", "eagle", doc))
        for rec in served("eagle", "eagle", 4, 20, 0.024):
            policy.observe(rec)
        policy.refit()
        pool = PoolView("eagle", "embedded", "eagle", 4, True, 1, 0, 8, reported_batch=batch)
        picks[(reported, batch)] = policy.decide(PROFILE, [pool]).k
    assert picks[(True, 4.0)] < picks[(False, 4.0)] == picks[(True, 1.0)]


def test_a_drafters_fixed_cost_is_measured_apart_from_its_per_token_cost() -> None:
    """EAGLE's head runs a forward whatever k: 3 ms on a 10 ms step, then 0.5 ms a token.
    Read through plain's point the line would price k = 1 at 1.2x plain; with the fixed
    part measured it is 1.35x, and the pool's cost before any traffic says so."""
    from policies.cost import curve_ratios, fit_step_cost, generic_trend

    costs = [cost("plain", 0, 1, 10.0), *[cost("eagle", k, 1, 13.0 + 0.5 * k) for k in (1, 2, 4)]]
    doc = Measured.from_dict({**MEASURED, "costs": costs})
    (point,) = WorkerPrior.from_measured("m", "eagle", doc).step_curve
    assert (point.base, point.overhead, point.per_token) == pytest.approx((1.0, 0.3, 0.05))
    ratios = curve_ratios([(point.batch, point.base, point.per_token, point.overhead)])
    fitted, _ = fit_step_cost([], generic_trend(0.01), ratios=ratios)
    assert fitted.step_s(1, 1.0) / fitted.step_s(0, 1.0) == pytest.approx(1.35)
    assert fitted.step_s(4, 1.0) / fitted.step_s(0, 1.0) == pytest.approx(1.5)


def test_no_speculation_goes_to_the_plain_pool() -> None:
    """EAGLE accepts almost nothing on this class: the answer is k = 0, and a plain pool
    serves it rather than the EAGLE pool's worker at k = 0 (both predicted alike here;
    the tie used to go to the EAGLE pool by name)."""
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0),
                    PolicyConfig(explore_rate=0.0))
    policy.set_worker_prior("eagle", WorkerPrior({("m", "eagle", "chat", "thigh"): 0.02}))
    policy.refit()
    both = [PoolView("eagle", "embedded", "eagle", 4, True, 1, 0, 8),
            PoolView("plain", "embedded", "plain", 0, False, 1, 0, 0)]
    decision = policy.decide(CHAT, both)
    assert (decision.pool, decision.k) == ("plain", 0)
    alone = policy.decide(CHAT, both[:1])  # no plain pool: k = 0 where it is
    assert (alone.pool, alone.k) == ("eagle", 0)
