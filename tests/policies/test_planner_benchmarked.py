"""The planner's launch benchmark from the workers' measured.json (policies/planner/
benchmarked.py): what a document says per (method, k) comes back as measured."""

from __future__ import annotations

import pytest

from policies.planner import Benchmarked, PoolSlot, benchmarked_from_measured, unmeasured
from policies.prior import Measured

BATCHES = (1, 8, 32)
TEMPERATURE = {"t0": 0.0, "tlow": 0.5, "thigh": 1.0}  # one per bucket
PLAIN = Benchmarked("plain", 0, {}, BATCHES, (0.020, 0.024, 0.040))
NGRAM = Benchmarked("ngram", 8, {("edit", "t0"): 6.0, ("chat", "t0"): 1.2,
                                 ("code", "t0"): 1.6}, BATCHES, (0.022, 0.027, 0.046))
EAGLE3 = Benchmarked("eagle3", 6, {("edit", "t0"): 3.2, ("chat", "t0"): 3.4,
                                   ("code", "t0"): 3.3}, BATCHES, (0.030, 0.036, 0.060))


def document(*measured: Benchmarked, costs: bool = True, plain: Benchmarked = PLAIN) -> dict:
    """The measured.json a worker publishes for these configurations: `bench engine`'s
    entries (one request at a time: batch 1) and, with `costs`, `bench batching`'s steps
    for them and for plain."""
    entries = [{"method": b.method, "k": b.k, "task": task,
                "temperature": TEMPERATURE[bucket], "accept_length": length,
                "tokens_per_s": length / b.step_s[0],
                "speedup": length * plain.step_s[0] / b.step_s[0], "requests": 4}
               for b in measured for (task, bucket), length in b.accept_length.items()]
    steps = [{"method": b.method, "k": b.k, "batch": batch, "step_s": step, "steps": 16}
             for b in (*measured, plain) for batch, step in zip(b.batches, b.step_s,
                                                                  strict=True)]
    return {"model": "m", "source": "test", "measured_at": "2026-12-04", "device": "test",
            "entries": entries, "costs": steps if costs else []}


def by_config(bench: tuple[Benchmarked, ...]) -> dict[tuple[str, int], Benchmarked]:
    return {(b.method, b.k): b for b in bench}


def test_each_configuration_comes_back_as_measured() -> None:
    docs = [Measured.from_dict(document(NGRAM)), Measured.from_dict(document(EAGLE3))]
    got = by_config(benchmarked_from_measured(docs))
    assert set(got) == {("plain", 0), ("ngram", 8), ("eagle3", 6)}
    for want in (PLAIN, NGRAM, EAGLE3):
        have = got[(want.method, want.k)]
        assert have.batches == want.batches
        assert have.step_s == pytest.approx(want.step_s)
        assert dict(have.accept_length) == pytest.approx(dict(want.accept_length))


def test_without_costs_the_entries_give_the_step_at_batch_one_and_plain_by_speedup() -> None:
    got = by_config(benchmarked_from_measured([Measured.from_dict(
        document(NGRAM, costs=False))]))
    assert got[("ngram", 8)].batches == (1,)
    assert got[("ngram", 8)].step_s == pytest.approx((NGRAM.step_s[0],))
    assert got[("plain", 0)].step_s == pytest.approx((PLAIN.step_s[0],))


def test_a_k_between_measured_costs_is_interpolated_and_a_k_never_run_is_left_out() -> None:
    doc = document(EAGLE3)
    k4 = [{**c, "k": 4, "step_s": c["step_s"] - 0.006} for c in doc["costs"]
          if c["method"] == "eagle3"]
    k8 = [{**c, "k": 8, "step_s": c["step_s"] + 0.006} for c in doc["costs"]
          if c["method"] == "eagle3"]
    doc["costs"] = [c for c in doc["costs"] if c["method"] != "eagle3"] + k4 + k8
    bench = benchmarked_from_measured([Measured.from_dict(doc)])
    assert by_config(bench)[("eagle3", 6)].step_s == pytest.approx(EAGLE3.step_s)
    assert ("eagle3", 4) not in by_config(bench)  # a step, but no accept length
    pools = [PoolSlot("e6", "eagle3", 6), PoolSlot("e12", "eagle3", 12),
             PoolSlot("plain", "plain", 0)]
    assert unmeasured(bench, pools) == ["e12"]
