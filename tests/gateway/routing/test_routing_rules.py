"""PoolRouter facts and the built-in policies, in process (no I/O)."""

from __future__ import annotations

import pytest

from gateway.classifier.minimal import Guarded, minimal_profile
from gateway.config import parse_config
from gateway.errors import InvalidRequest
from gateway.pins import Pin
from gateway.pools import build_pools
from gateway.routing.router import PoolRouter
from gateway.schemas import GenerationRequest, parse_request
from policies.protocol import Rule
from policies.rules import static_rules
from policies.types import Decision, PoolView, RequestProfile


def view(name: str, method: str, k: int = 3, healthy: int = 1, load: int = 0) -> PoolView:
    return PoolView(name=name, engine="sglang", method=method, k=k, per_request_k=False,
                    healthy_workers=healthy, outstanding=load)


def profile(task: str = "chat", temperature: float = 0.0) -> RequestProfile:
    return RequestProfile(task=task, temperature=temperature, top_p=1.0,  # type: ignore[arg-type]
                          prompt_tokens=10, max_tokens=10, stream=False)


POOLS = [view("plain", "plain", 0), view("ng", "ngram", 4), view("la", "lookahead", 4),
         view("e3", "eagle3", 4), view("e3b", "eagle3", 4, load=5)]


@pytest.mark.parametrize(("task", "temperature", "pool"), [
    ("code", 0.0, "ng"), ("structured", 0.0, "la"), ("chat", 0.5, "e3"),
    ("code", 1.0, "plain"), ("chat", 0.71, "plain"),
])
def test_static_rules_map_class_to_method(task: str, temperature: float, pool: str) -> None:
    decision = static_rules(profile(task, temperature), POOLS)
    assert decision.pool == pool and decision.reason.startswith("static rule")
    assert pool not in decision.fallbacks and len(decision.fallbacks) == len(POOLS) - 1


def test_static_rules_prefer_the_less_loaded_pool_and_put_plain_last() -> None:
    decision = static_rules(profile("chat", 0.0), POOLS)
    assert decision.fallbacks[0] == "e3b" and decision.fallbacks[-1] == "plain"
    lonely = static_rules(profile("code", 0.0), [view("e", "eagle"), view("p", "plain", 0)])
    assert (lonely.pool, lonely.reason) == ("e", "static rule: code -> eagle")


def test_static_rules_take_hybrid_where_the_first_choice_is_missing() -> None:
    """An embedded fleet (no EAGLE-3): chat goes to hybrid before plain EAGLE; an edit
    still to n-gram while there is one."""
    fleet = [view("p", "plain", 0), view("e", "eagle"), view("h", "hybrid"),
             view("n", "ngram", 4)]
    assert static_rules(profile("chat"), fleet).pool == "h"
    assert static_rules(profile("edit"), fleet).pool == "n"
    assert static_rules(profile("edit"), fleet[:3]).pool == "h"


def test_failover_order_keeps_policy_fallbacks_and_adds_plain_last() -> None:
    pools = [{"name": n, "engine": "sglang", "model": "m", "method": m, "k": k,
              "workers": ["http://a:1"]}
             for n, m, k in (("p", "plain", 0), ("a", "eagle", 3), ("b", "ngram", 4),
                             ("c", "medusa", 2))]
    built = build_pools(parse_config({"pools": pools}))
    for pool in built.values():
        pool.workers[0].healthy = True

    def decide(_: RequestProfile, views: list[PoolView]) -> Decision:
        return Decision(pool="b", method="ngram", k=4, reason="test", fallbacks=("p", "a"))

    router = PoolRouter(built, Rule(decide, "test"))
    request = parse_request({"model": "m", "prompt": "x"}, "completions")
    decision, order = router.route(request, minimal_profile(request, "t"))
    assert [p.name for p in order] == ["b", "a", "p"]  # c is not a fallback; plain last
    _, pinned = router.route(request, minimal_profile(request, "t"),
                             Pin(pool="a"))
    assert [p.name for p in pinned] == ["a"]  # a pinned pool never fails over


def test_pin_headers_are_validated() -> None:
    assert Pin.from_headers("x", "4") == Pin("x", 4)
    assert Pin.from_headers(None, None) == Pin()
    for bad in ("-1", "1.5", "17", ""):
        with pytest.raises(InvalidRequest, match="x-specroute-k"):
            Pin.from_headers(None, bad)


def test_a_failing_classifier_degrades_to_the_minimal_profile() -> None:
    def broken(request: GenerationRequest, tenant: str) -> RequestProfile:
        raise KeyError("bug")

    guarded = Guarded(broken)
    body = {"model": "m", "prompt": "x", "response_format": {"type": "json_object"}}
    got = guarded(parse_request(body, "completions"), "t")
    assert got.reasons == ("minimal_profile",) and got.task == "structured"
