"""Accept length at each k from a run's accept histogram (policies/accept_curve.py), and
the histogram's way from the worker's answer to the policy's state."""

from __future__ import annotations

import random

import pytest

from bench.traces.world import Trace, walk
from gateway.upstream.adapters.reply import accept_histogram
from policies.accept_curve import accept_length_at
from policies.decision import Policy, PolicyConfig
from policies.telemetry import LocalTelemetry
from policies.types import PoolView, RequestProfile, RequestRecord
from workers.embedded.api import GenerationStats
from workers.embedded.responses import merge_histograms, spec_fields, spec_tokens_details


def runs(seed: int, k: int, steps: int = 400) -> tuple[list[int], list[int]]:
    """Accept lengths of a drafter whose acceptance comes in runs (none, or a long copy),
    and the run's histogram at k."""
    rng = random.Random(seed)
    lengths = [1 if rng.random() < 0.6 else min(rng.randint(2, 14), k + 1)
               for _ in range(steps)]
    histogram = [0] * (k + 1)
    for length in lengths:
        histogram[length - 1] += 1
    return lengths, histogram


def test_exact_at_the_run_k_and_where_k_plus_1_divides_it_a_lower_bound_elsewhere() -> None:
    lengths, histogram = runs(0, 8)
    assert accept_length_at(histogram, 8, 8) == pytest.approx(sum(lengths) / len(lengths))
    # the same steps as a trace recorded at 8: the world's walk at each smaller k
    trace = Trace("r", "c", "ngram", 8, 10, sum(lengths) + 1, tuple(lengths),
                  tuple([8] * len(lengths)), 0.0)
    for k in (1, 2, 3, 4, 6):
        w = walk(trace, k)
        assert accept_length_at(histogram, 8, k) == pytest.approx(w.tokens / len(w.yields))
    # a run cut at k 2 and gone on in the next step: at k 1 the merged run needs fewer
    # steps than the two pieces, so the histogram's reading is a lower bound there ...
    cut = Trace("r", "c", "ngram", 2, 10, 10, (3, 3, 3), (2, 2, 2), 0.0)
    merged = Trace("r", "c", "ngram", 8, 10, 10, (9,), (8,), 0.0)
    w = walk(merged, 1)
    assert accept_length_at([0, 0, 3], 2, 1) < w.tokens / len(w.yields)
    assert accept_length_at([0, 0, 3], 2, 0) == 1.0  # ... exact where k' + 1 divides 3
    assert walk(cut, 2).tokens == 9


def test_no_gain_is_read_above_the_run_k() -> None:
    histogram = [50, 0, 0, 10, 10]  # k 4: 10 steps took all 4 drafts
    assert accept_length_at(histogram, 4, 6) == accept_length_at(histogram, 4, 4)
    assert accept_length_at([10, 0, 0, 0, 0], 4, 8) == pytest.approx(1.0)


def test_the_embedded_worker_reports_the_histogram_as_sglang_names_it() -> None:
    stats = GenerationStats(completion_tokens=9, verify_steps=4, num_proposed_drafts=12,
                            num_correct_drafts=5)
    for accepted in (0, 4, 1):
        stats.add_accepted(accepted)
    info = spec_fields(stats)
    assert info["spec_correct_drafts_histogram"] == [1, 1, 0, 0, 1]
    assert spec_tokens_details(info)["spec_correct_drafts_histogram"] == [1, 1, 0, 0, 1]
    assert merge_histograms([[1, 1], [0, 2, 3]]) == [1, 3, 3]
    assert accept_histogram([1, 1, 0, 0, 1]) == (1, 1, 0, 0, 1)
    assert accept_histogram([1, "x"]) is None and accept_histogram([]) is None


def test_the_policy_state_keeps_each_pool_and_class_histogram() -> None:
    policy = Policy(LocalTelemetry(tau_s=1e6, clock=lambda: 1.0), PolicyConfig())
    edit = RequestProfile(task="edit", temperature=0.0, top_p=1.0, prompt_tokens=100,
                          max_tokens=20, stream=False, model="m")
    policy.decide(edit, [PoolView("ngram", "sglang", "ngram", 4, False, 1, 0)])
    for histogram in ((5, 0, 1), (3, 1, 0, 0, 2)):
        policy.observe(RequestRecord(
            model="m", pool="ngram", method="ngram", k=4, task="edit",
            temperature_bucket="t0", prompt_tokens=100, output_tokens=20, verify_steps=10,
            accept_length=2.0, load=0, ttft_s=0.01, itl_s=0.01, e2e_s=0.1,
            timestamp=1.0, accept_histogram=histogram))
    state = policy.refit()
    assert state.accept_histograms[("ngram", 4, "m", "edit", "t0")] == pytest.approx(
        (8.0, 1.0, 1.0, 0.0, 2.0))
