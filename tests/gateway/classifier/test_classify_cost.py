"""Classification and the routing decision stay cheap: counted, not timed.

A shared CI box makes absolute timings meaningless, so this counts what the hot path
does (Python function calls, under `sys.setprofile`) and compares its CPU time with a
fixed pure-Python yardstick measured in the same test, interleaved, so a slow machine
slows both. Bounds are generous (about 3x today's figures): they catch a return of
whole-prompt regex scans or per-request object churn, not noise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from bench.gateway.classifier import PROMPT_4KB, _router, chat_request
from gateway.classifier.classify import classify


def _calls(step: Callable[[], object]) -> dict[str, int]:
    counts = {"call": 0, "c_call": 0}

    def profile(frame: object, event: str, arg: object) -> None:
        if event in counts:
            counts[event] += 1

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return counts


def _cpu_ns(step: Callable[[], object], repeat: int) -> int:
    start = time.thread_time_ns()
    for _ in range(repeat):
        step()
    return (time.thread_time_ns() - start) // repeat


def test_classify_and_route_do_a_bounded_amount_of_work() -> None:
    request, router = chat_request(PROMPT_4KB), _router()
    profile = classify(request)
    assert profile.reasons[0].startswith("model:")  # the slowest path: rules, then model
    classified = _calls(lambda: classify(request))
    routed = _calls(lambda: router.route(request, profile))
    assert classified["call"] <= 120 and classified["c_call"] <= 200, classified
    assert routed["call"] <= 300 and routed["c_call"] <= 120, routed


def test_classify_and_route_cost_against_a_yardstick() -> None:
    """4 KB prompt, classify + route: ~2x `sum(range(5000))` on the dev box (main before this work: ~3.8x)."""
    request, router = chat_request(PROMPT_4KB), _router()

    def step() -> None:
        router.route(request, classify(request))

    def yardstick() -> None:
        sum(range(5000))

    for _ in range(50):
        step()
    ratios = sorted(_cpu_ns(step, 20) / max(1, _cpu_ns(yardstick, 20)) for _ in range(15))
    assert ratios[len(ratios) // 2] < 4.0, ratios
