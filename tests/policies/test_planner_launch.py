"""The launch plan of a fixed-k fleet reads a benchmark of every (method, k): the best
configuration for the mix, a split only where a class gains `split_margin` from its own,
workers by demand in verify steps (policies/planner/launch.py)."""

from __future__ import annotations

import pytest

from policies.planner.launch import Benchmarked, apportion, plan_launch

BATCHES = (1, 8, 32)


def bench(method: str, k: int, lengths: dict, step_s: tuple = (0.03, 0.035, 0.06)
          ) -> Benchmarked:
    return Benchmarked(method, k, lengths, BATCHES, step_s)


EDIT, CODE = ("edit", "t0"), ("code", "t0")
DEEP = bench("eagle3", 12, {EDIT: 5.0, CODE: 9.0}, (0.05, 0.055, 0.09))
SHALLOW = bench("eagle3", 3, {EDIT: 3.0, CODE: 3.6})
NGRAM = bench("ngram", 12, {EDIT: 10.0, CODE: 2.0}, (0.02, 0.025, 0.05))
PLAIN = bench("plain", 0, {}, (0.015, 0.017, 0.025))


def test_one_configuration_best_for_every_class_is_a_homogeneous_fleet() -> None:
    plan = plan_launch([DEEP, SHALLOW, PLAIN], {EDIT: 1.0, CODE: 1.0}, 12)
    assert [(p.name, p.workers) for p in plan.pools] == [("eagle3-k12", 12)]
    assert plan.best_single == ("eagle3", 12)


def test_a_class_with_a_much_better_configuration_gets_its_own_pool() -> None:
    plan = plan_launch([DEEP, NGRAM, PLAIN], {EDIT: 1.0, CODE: 3.0}, 12)
    pools = {p.name: p for p in plan.pools}
    assert set(pools) == {"eagle3-k12", "ngram-k12"}
    assert pools["ngram-k12"].classes == (EDIT,)
    # demand in verify steps: code 3 x 256 / 9 against edits 1 x 256 / 10
    assert pools["eagle3-k12"].workers > pools["ngram-k12"].workers >= 1
    assert sum(p.workers for p in plan.pools) == 12


def test_a_small_gain_is_folded_into_the_best_single_configuration() -> None:
    close = bench("ngram", 12, {EDIT: 5.3, CODE: 2.0}, (0.05, 0.055, 0.09))
    plan = plan_launch([DEEP, close], {EDIT: 1.0, CODE: 1.0}, 12, split_margin=0.10)
    assert [p.name for p in plan.pools] == ["eagle3-k12"]


def test_step_time_is_interpolated_between_measured_batches() -> None:
    assert DEEP.step_at(0.5) == pytest.approx(0.05)
    assert DEEP.step_at(20) == pytest.approx(0.055 + (0.09 - 0.055) * 12 / 24)
    assert DEEP.step_at(64) == pytest.approx(0.09)
    assert PLAIN.tokens_per_s(CODE, 1) == pytest.approx(1 / 0.015)


def test_apportion_gives_each_a_worker_and_sums_to_the_total() -> None:
    assert apportion([10.0, 1.0], 12) == [10, 2]  # 9.09 + 1 and 0.91 + 1, rounded up
    assert sum(apportion([3.0, 2.0, 1.0], 12)) == 12
    assert apportion([1.0, 5.0], 1) == [0, 1]
    with pytest.raises(ValueError):
        plan_launch([], {CODE: 1.0}, 12)


def test_candidates_are_the_configurations_some_class_or_the_mix_measured_best() -> None:
    from policies.planner.launch import candidate_configs

    got = candidate_configs([DEEP, SHALLOW, NGRAM, PLAIN], [EDIT, CODE], BATCHES)
    assert ("eagle3", 12) in got and ("ngram", 12) in got and ("plain", 0) in got
    assert ("eagle3", 3) not in got  # beaten for every class at every batch
