"""Benchmark traffic moves no fixed-k pool's desired k.

In `specroute bench vllm` (docs/results/2026-12-02-vllm.md) the n-gram pool's desired k
went 4 -> 6 and, ten minutes later, back to 4, and the write-up asked whether the pinned
phase had taught it. It cannot have: the gateway reads the live bench's pinned headers as
a `Pin`, the record is marked `pinned`, and the store folds no pinned record into the
aggregates that the desired-k publisher reads (`pool_k_known`, acceptance, traffic). The
same requests *unpinned* do move it: the bench's learning phase sends its 50 edits first,
and an edits-only mix wants k 6 on a pool whose edits accept ~4.5 tokens a step at k 4
(its acceptance measured, the wish held for `relaunch_cost_s`, 60 s by default); the code
and chat that follow want 4 again, which the pool gets once the payback horizon
(`relaunch_payback_s`, 600 s) has passed: the move seen live."""

from __future__ import annotations

import random

from bench.live.fleets import fleets
from gateway.pins import Pin
from policies.decision import Policy, PolicyConfig
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord

TOKENS = 48
EDIT_ACCEPT = 4.46  # vLLM CPU n-gram k 4 on edits, tokens a step (2026-12-02-vllm.md)
EDIT_TPS = 20.5


def _views() -> list[PoolView]:
    return [PoolView("vllm-plain", "vllm", "plain", 0, False, 1, 0, 0),
            PoolView("vllm-ngram", "vllm", "ngram", 4, False, 1, 0, 16)]


def _published(pinned: bool, edits: int = 120) -> list[int]:
    """The n-gram pool's desired k, each change, over `edits` greedy edits served on it
    (one refit a second, as the learner thread does), marked `pinned` or not."""
    clock = [0.0]
    config = PolicyConfig(explore_rate=0.0)  # the shipped relaunch terms
    policy = Policy(LocalTelemetry(config.decay_tau_s, clock=lambda: clock[0]), config)
    profile = RequestProfile(task="edit", temperature=0.0, top_p=1.0, prompt_tokens=120,  # type: ignore[arg-type]
                             max_tokens=TOKENS, stream=False, model="smollm2")
    rng = random.Random(3)
    published: list[int] = []
    next_refit = 0.0
    for _ in range(edits):
        policy.decide(profile, _views())
        accept = EDIT_ACCEPT * rng.uniform(0.9, 1.1)
        e2e = TOKENS / (EDIT_TPS * rng.uniform(0.9, 1.1))
        clock[0] += e2e + 0.2
        policy.observe(RequestRecord(
            model="smollm2", pool="vllm-ngram", method="ngram", k=4, task="edit",
            temperature_bucket="t0", prompt_tokens=120, output_tokens=TOKENS,
            verify_steps=round(TOKENS / accept), accept_length=accept, load=0,
            ttft_s=e2e / 11, itl_s=0.0, e2e_s=e2e, workers=1, timestamp=clock[0],
            pinned=pinned))
        while next_refit <= clock[0]:
            policy.refit()
            next_refit += config.refit_interval_s
            wished = policy.store.desired_k.get("vllm-ngram")  # type: ignore[attr-defined]
            if wished is not None and (not published or published[-1] != wished):
                published.append(wished)
    return published


def test_the_live_benchs_pinned_requests_are_pins_and_move_no_desired_k() -> None:
    homogeneous = [f for f in fleets("vllm", ["plain", "ngram"], ["plain", "ngram"])
                   if f.name == "2xngram"]
    (config,) = homogeneous[0].configs
    headers = config.headers
    pin = Pin.from_headers(headers.get("x-specroute-pool"), headers.get("x-specroute-k"),
                           headers.get("x-specroute-benchmark"))
    assert pin.active and pin.pool == "vllm-ngram"  # the record is marked pinned
    # 120 pinned edits, ~5 minutes: the published k never leaves the launched 4
    assert _published(pinned=pin.active) == [4]


def test_the_same_edits_unpinned_ask_for_k_6() -> None:
    """The control, and what moved k live: unpinned edits alone teach the publisher that
    k 6 pays on this pool."""
    assert _published(pinned=False) == [4, 6]
