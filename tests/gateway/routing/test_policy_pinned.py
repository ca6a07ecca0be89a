"""Pinned traffic does not teach the policy, and says which k it ran.

Requests pinned with `x-specroute-pool` / `x-specroute-k`, or marked with
`x-specroute-benchmark`, are benchmarks and debugging: they are recorded with a `pinned`
mark (the telemetry stream, Prometheus and OpenTelemetry still see them) and never reach
the aggregates the policy learns from. A pinned k is predicted at that k, never at the
policy's own choice."""

from __future__ import annotations

import re

import pytest

from gateway.classifier.minimal import minimal_profile
from gateway.config import parse_config
from gateway.errors import InvalidRequest
from gateway.pins import Pin
from gateway.pools import build_pools
from gateway.routing.router import PoolRouter
from gateway.schemas import parse_request
from gateway.telemetry.record import Outcome, Timer
from gateway.telemetry.worker_stats import SpecStats, Usage
from gateway.tenants.auth import DEFAULT_TENANT
from policies.learner import Learner
from policies.telemetry import LocalTelemetry
from policies.types import Decision, RequestRecord
from tests.gateway.telemetry.test_policy_unknown_spec import _reporter
from tests.policies.test_policy_decide import PROFILE, trained


def test_pin_k_is_ascii_digits_only() -> None:
    for bad in ("²", "١", "３", "4\u00a0", "+3"):  # isdigit() is true for the first three
        with pytest.raises(InvalidRequest) as info:
            Pin.from_headers(None, bad)
        assert info.value.status == 400 and info.value.param == "x-specroute-k"
    assert Pin.from_headers(None, " 3 ") == Pin(k=3)


def _router(policy) -> PoolRouter:
    pools = [{"name": "eagle3", "engine": "embedded", "model": "m", "method": "eagle3",
              "k": 4, "workers": ["http://a:1"], "capabilities": {"per_request_k": True}},
             {"name": "plain", "engine": "sglang", "model": "m", "method": "plain",
              "workers": ["http://b:1"]}]
    built = build_pools(parse_config({"pools": pools}))
    for pool in built.values():
        pool.workers[0].healthy = True
    return PoolRouter(built, policy)


def test_pinned_k_is_the_k_the_reason_states() -> None:
    policy = trained()
    router = _router(policy)
    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")
    free, _ = router.route(request, PROFILE)
    assert free.pool == "eagle3" and free.k > 3 and not free.pinned
    decided = policy.explored_fraction, policy._decided
    pinned, _ = router.route(request, PROFILE, Pin(k=3))
    assert (pinned.pool, pinned.k, pinned.pinned) == ("eagle3", 3, True)
    assert set(re.findall(r"k=(\d+)", pinned.reason)) == {"3"}, pinned.reason
    assert "x-specroute-k" in pinned.reason
    assert (policy.explored_fraction, policy._decided) == decided  # not a policy decision
    by_pool, _ = router.route(request, PROFILE, Pin(pool="plain"))
    assert by_pool.pinned and by_pool.reason == "pinned by x-specroute-pool"
    marked, _ = router.route(request, PROFILE, Pin(benchmark=True))
    assert marked.pinned and marked.pool == free.pool  # routed as usual, marked
    assert Pin.from_headers(None, None, "1") == Pin(benchmark=True)


def test_pinned_records_are_marked_and_do_not_teach() -> None:
    records: list[RequestRecord] = []
    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")
    _reporter(records).record(Outcome(
        request, minimal_profile(request, "t"), DEFAULT_TENANT,
        Decision("p", "eagle", 3, "pinned", pinned=True), Timer(), usage=Usage(5, 9),
        spec=SpecStats(3, 3.0), ok=True))
    (entry,) = records
    assert entry.pinned
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    store.record(entry)
    assert store.snapshot() == {}
    assert Learner().fit(store.snapshot()).traffic == {}
