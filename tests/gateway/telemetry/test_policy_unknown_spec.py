"""A request whose upstream reported no speculation counters is unknown, not perfect: it
counts as traffic but never for acceptance (a record with verify_steps 0 used to count
as one step for the whole output, i.e. a ≈ 0.995)."""

from __future__ import annotations

import pytest

from gateway.classifier.minimal import minimal_profile
from gateway.schemas import parse_request
from gateway.telemetry.record import Outcome, Reporter, Timer
from gateway.telemetry.spans import make_tracer
from gateway.telemetry.worker_stats import SpecStats, Usage
from gateway.tenants.auth import DEFAULT_TENANT
from gateway.tenants.limits import Limits
from policies.acceptance import expected_accept_length
from policies.learner import Learner
from policies.telemetry import LocalTelemetry
from policies.types import Decision, RequestRecord


def _record(verify_steps: int | None, tokens: int = 120, k: int = 4) -> RequestRecord:
    accept = tokens / verify_steps if verify_steps else 0.0
    return RequestRecord(model="m", pool="eagle", method="eagle", k=k, task="chat",
                         temperature_bucket="t0", prompt_tokens=50, output_tokens=tokens,
                         verify_steps=verify_steps, accept_length=accept, load=0,
                         ttft_s=0.02, itl_s=0.02, e2e_s=2.0, timestamp=1.0)


@pytest.mark.parametrize("unknown", [None, 0])
def test_records_without_counters_do_not_move_acceptance(unknown: int | None) -> None:
    store = LocalTelemetry(tau_s=1e6, clock=lambda: 1.0)
    steps = round(120 / expected_accept_length(0.7, 4))
    for _ in range(20):
        store.record(_record(steps))
    before, n_before = Learner().fit(store.snapshot()).accept("m", "eagle", "chat", "t0")
    for _ in range(5):
        store.record(_record(unknown))
    state = Learner().fit(store.snapshot())
    after, n_after = state.accept("m", "eagle", "chat", "t0")
    assert after == pytest.approx(before, abs=1e-9)  # was 0.70 -> 0.85
    assert n_after == pytest.approx(n_before)  # only measured requests back acceptance
    assert state.traffic[("eagle", "m", "chat", "t0")] == pytest.approx(25)  # still traffic
    (stats,) = store.snapshot().values()
    assert stats.step_s == pytest.approx(1.98 / (steps - 1), rel=1e-6)  # cost not diluted


def _reporter(records: list) -> Reporter:
    class ListRecorder:
        def record(self, record) -> None:
            records.append(record)

    _, tracer = make_tracer("none")
    return Reporter(ListRecorder(), {}, Limits().spend, tracer)


@pytest.mark.parametrize(("k", "spec", "steps"), [
    (4, SpecStats(), None),  # speculative upstream, no counters: unknown
    (4, SpecStats(accept_length=3.0), 3),  # only the mean accept length: steps follow
    (4, SpecStats(verify_steps=4, accept_length=2.25), 4),
    (0, SpecStats(), 9),  # plain: one token per step
])
def test_dispatch_records_unknown_steps_as_none(k: int, spec: SpecStats,
                                                steps: int | None) -> None:
    records: list[RequestRecord] = []
    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")
    _reporter(records).record(Outcome(
        request, minimal_profile(request, "t"), DEFAULT_TENANT,
        Decision("p", "eagle", k, "test"), Timer(), usage=Usage(5, 9), spec=spec, ok=True))
    (entry,) = records
    assert entry.verify_steps == steps


@pytest.mark.parametrize(("decode_s", "ttft_s"), [
    (1.6, 0.4),  # the worker said its decode steps took 1.6 s of the 2 s: prefill 0.4 s
    (None, 2.0 / 3),  # no report: one verify step's share of the whole (3 steps)
])
def test_a_whole_answer_splits_its_time_by_the_workers_decode_time(
        decode_s: float | None, ttft_s: float) -> None:
    """Not streamed, the gateway sees only the end: with the worker's decode time the
    record's TTFT is the rest, so a request of 3 steps (n-gram on an edit: 19 tokens)
    does not read its prefill as two very slow steps (what made n-gram look 4x slower at
    a batch of 1 than of 4 on the live edit mix)."""
    records: list[RequestRecord] = []
    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")
    timer = Timer()
    timer.start -= 2.0  # the answer took 2 s
    _reporter(records).record(Outcome(
        request, minimal_profile(request, "t"), DEFAULT_TENANT,
        Decision("p", "ngram", 8, "test"), timer, usage=Usage(5, 19),
        spec=SpecStats(verify_steps=3, accept_length=19 / 3, decode_s=decode_s), ok=True))
    (entry,) = records
    assert entry.e2e_s == pytest.approx(2.0, abs=0.05)
    assert entry.ttft_s == pytest.approx(ttft_s, abs=0.05)
    assert entry.ttft_s + entry.itl_s * 18 == pytest.approx(entry.e2e_s)
