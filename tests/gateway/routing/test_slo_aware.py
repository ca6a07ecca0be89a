"""The SLO-aware policy (gateway/routing/slo_aware.py) on the real learned policy and real
pools: the verdict it appends to the policy's reason, under load and for explain, the
decision otherwise the policy's own; a tenant reloaded with new targets is checked
against the new ones; and the router's capability filter with one pool too small."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.classifier.minimal import minimal_profile
from gateway.config import TenantConfig, hash_api_key, parse_config
from gateway.core.services import Core
from gateway.errors import InvalidRequest
from gateway.routing.admission import PoolQueue
from gateway.routing.slo_aware import SloAware, option, with_reason
from gateway.schemas import GenerationRequest, parse_request
from policies.slo import choose
from policies.types import Decision, PoolView, RequestProfile

FIELDS = {"pool", "method", "k", "reason", "predicted_accept_length",
          "predicted_tokens_per_s", "explored", "fallbacks", "pinned", "accept_scale"}


def core(contexts: tuple[int, int] = (4096, 4096)) -> Core:
    config = parse_config({
        "pools": [{"name": "eagle", "engine": "sglang", "model": "m", "method": "eagle",
                   "k": 3, "workers": ["http://127.0.0.1:1"],
                   "capabilities": {"max_context": contexts[0]}},
                  {"name": "plain", "engine": "sglang", "model": "m", "method": "plain",
                   "k": 0, "workers": ["http://127.0.0.1:2"],
                   "capabilities": {"max_context": contexts[1]}}],
        "tenants": [{"name": "acme", "api_key_sha256": [hash_api_key("sk")],
                     "slo_tpot_ms": 5000}]})
    built = Core(config, policy="learned", classify=minimal_profile)
    for pool in built.pools.values():
        pool.workers[0].healthy = True  # as if probed
    return built


def profile(gateway: Core, max_tokens: int | None = None
            ) -> tuple[GenerationRequest, RequestProfile]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            **({} if max_tokens is None else {"max_tokens": max_tokens})}
    request = parse_request(body, "chat")
    return request, gateway.classify(request, "acme")


def checked(loaded: bool) -> tuple[SloAware, RequestProfile, list[PoolView]]:
    """The SLO-aware policy, a request's profile and the pools' views, with every pool
    busy (past `admission.busy_per_worker`) when `loaded`."""
    gateway = core()
    _, request_profile = profile(gateway)
    for pool in gateway.pools.values():
        pool.workers[0].outstanding = 10 if loaded else 0
    policy = gateway.router.policy
    assert isinstance(policy, SloAware)
    return policy, request_profile, [pool.view() for pool in gateway.pools.values()]


def test_with_reason_is_replace_of_the_reason_alone() -> None:
    """`with_reason` spells out `dataclasses.replace`: every field but the reason carried
    over; a field added to `Decision` fails here until it is carried too."""
    assert {f.name for f in dataclasses.fields(Decision)} == FIELDS
    decision = Decision("p", "eagle", 3, "why", 2.5, 80.0, True, ("q", "r"), True, 1.25)
    assert with_reason(decision, "new") == dataclasses.replace(decision, reason="new")


def test_under_load_the_verdict_joins_the_policys_reason() -> None:
    slo, request_profile, views = checked(loaded=True)
    inner = slo.inner.predict(request_profile, views)
    verdict = slo.predict(request_profile, views)
    assert verdict.reason.startswith(
        f"{inner.reason}; slo acme: policy's pick meets ({inner.pool} {inner.method} "
        f"k={inner.k} (tpot {1000 / inner.predicted_tokens_per_s:.0f} ms, wait 0 ms)), ")
    assert verdict.reason.endswith("targets ttft 2000 ms, tpot 5000 ms")
    assert verdict == dataclasses.replace(inner, reason=verdict.reason)
    live = slo.decide(request_profile, views)  # the live path: the same verdict
    assert live.reason == verdict.reason


def test_idle_explain_says_why_the_pick_stands_and_live_keeps_the_reason() -> None:
    slo, request_profile, views = checked(loaded=False)
    inner = slo.inner.predict(request_profile, views)
    explained = slo.predict(request_profile, views)
    tpot = 1000 / inner.predicted_tokens_per_s
    assert explained == dataclasses.replace(inner, reason=(
        f"{inner.reason}; slo acme: meets (tpot {tpot:.0f} ms <= 5000 ms), no pool busy"))
    assert slo.decide(request_profile, views).reason == inner.reason


def test_a_reloaded_tenant_is_checked_against_its_new_targets() -> None:
    slo, request_profile, views = checked(loaded=True)
    assert "targets ttft 2000 ms, tpot 5000 ms" in slo.predict(request_profile, views).reason
    tenants = slo.tenants
    assert isinstance(tenants, dict)
    tenants["acme"] = TenantConfig("acme", slo_ttft_ms=900, slo_tpot_ms=4000)
    assert "targets ttft 900 ms, tpot 4000 ms" in slo.predict(request_profile, views).reason


def test_a_pool_too_small_for_one_request_is_excluded_for_it_alone() -> None:
    gateway = core(contexts=(4096, 200))
    request, request_profile = profile(gateway, max_tokens=500)
    wanted = request_profile.prompt_tokens + 500
    assessed = {a.pool.name: a.excluded for a in gateway.router.assess(request, request_profile)}
    assert assessed == {"eagle": None, "plain": f"has max_context < ~{wanted} tokens needed"}
    decision, pools = gateway.router.route(request, request_profile)
    assert [p.name for p in pools] == ["eagle"]
    small, small_profile = profile(gateway, max_tokens=8)  # fits both: both eligible again
    assert all(a.excluded is None for a in gateway.router.assess(small, small_profile))
    with pytest.raises(InvalidRequest, match="max_context"):
        large, large_profile = profile(gateway, max_tokens=5000)
        gateway.router.route(large, large_profile)


@pytest.mark.parametrize("loaded", [False, True])
@pytest.mark.parametrize("higher", [(), ("eagle",), ("plain",), ("eagle", "plain")])
@pytest.mark.parametrize("tpot_ms", [5000.0, 1.0])
def test_the_verdict_is_choose_over_every_option(loaded: bool, higher: tuple[str, ...],
                                                 tpot_ms: float) -> None:
    """Whatever the skipped options would have been, the verdict is `choose`'s over all
    of them: every pool's state and prediction (busy or not, higher-priority work in
    some pools, a pick that meets or misses)."""
    slo, request_profile, views = checked(loaded=loaded)
    for name in higher:  # a priority-5 request runs there
        slo.admission.queues.setdefault(name, PoolQueue()).running_by_priority[5] += 1
    tenant = TenantConfig("acme", slo_tpot_ms=tpot_ms)
    slo.tenants["acme"] = tenant  # type: ignore[index]
    inner = slo.inner.predict(request_profile, views)
    states = {v.name: slo.admission.pool_state(v.name, tenant) for v in views}
    pick = option(inner.pool, inner.method, inner.k, inner.predicted_tokens_per_s,
                  inner.predicted_accept_length, states[inner.pool])
    expected = choose(pick, slo._options(request_profile, views, states), slo._target(tenant))
    verdict = slo.predict(request_profile, views)
    assert slo.predict(request_profile, views) == verdict  # kept, or built again: the same
    if not loaded and pick.meets(slo._target(tenant)):
        assert verdict.reason.endswith("no pool busy")  # the idle path: nothing to choose
        return
    assert verdict.reason == f"{inner.reason}; {expected.reason}"
    assert verdict.pool == expected.option.pool and verdict.k == expected.option.k


def test_under_load_a_pick_that_meets_costs_no_prediction_per_pool() -> None:
    """Every pool busy, no higher-priority work: the pick stands, so the policy is asked
    once (its decision), not once more per pool; with higher-priority work running the
    options are predicted, and the request yields."""
    slo, request_profile, views = checked(loaded=True)
    calls: list[str] = []
    predict = slo.inner.predict

    def counted(profile: RequestProfile, pools: list[PoolView]) -> Decision:
        calls.append(pools[0].name)
        return predict(profile, pools)

    slo.inner.predict = counted  # type: ignore[method-assign]
    decision = slo.decide(request_profile, views)
    assert calls == [] and "policy's pick meets" in decision.reason
    assert slo.decide(request_profile, views) is decision  # the verdict kept
    assert len(slo.kept) == 1
    for name in ("eagle", "plain"):  # a priority-5 request runs on each
        slo.admission.queues.setdefault(name, PoolQueue()).running_by_priority[5] += 1
    decision = slo.decide(request_profile, views)
    assert sorted(calls) == ["eagle", "plain"] and "yields under load" in decision.reason
