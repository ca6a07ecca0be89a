"""The in-process aggregates fold a request without building its increments, and drop a
context's stale fields only when its eras turn (policies/aggregates.py): the same
hashes as adding `forward_increments` and dropping `stale_fields` request by request."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from policies.aggregates import (
    DECAY_TAU_S,
    ERA_TAUS,
    RECENT_FRACTION,
    ContextKey,
    LocalAggregates,
    add_forward,
    forward_increments,
    record_values,
    stale_fields,
    teaches,
)
from policies.types import RequestRecord

BASE = RequestRecord(model="m", pool="ngram", method="ngram", k=4, task="edit",
                     temperature_bucket="t0", prompt_tokens=200, output_tokens=64,
                     verify_steps=20, accept_length=3.2, load=0, ttft_s=0.05, itl_s=0.01,
                     e2e_s=0.7, workers=1, accept_histogram=(3, 5, 0, 2, 10))


def _one_by_one(records: list[RequestRecord], tau: float) -> dict[str, dict[str, float]]:
    """What `LocalAggregates.add` did before: every increment built, every stale name popped."""
    hashes: dict[str, dict[str, float]] = {}
    for rec in records:
        if not teaches(rec):
            continue
        fields = hashes.setdefault(ContextKey.of(rec).encode(), {})
        for name, inc in forward_increments(record_values(rec), rec.timestamp, tau).items():
            fields[name] = fields.get(name, 0.0) + inc
        for name in stale_fields(rec.timestamp, tau):
            fields.pop(name, None)
    return hashes


def _records(seed: int) -> list[RequestRecord]:
    """Three contexts over six main eras (so many more of the recent view's), in time
    order except for a few late ones, some two eras late; a pinned one teaches nothing."""
    rng = random.Random(seed)
    era = ERA_TAUS * DECAY_TAU_S
    t, out = 1.7e9, []
    for i in range(400):
        t += rng.uniform(0, era / 60)
        late = era * rng.choice((1, 2.5)) if rng.random() < 0.03 else 0.0
        out.append(replace(BASE, timestamp=t - late, task=rng.choice(("edit", "chat", "code")),
                           output_tokens=rng.randint(1, 200), verify_steps=rng.randint(1, 60),
                           accept_histogram=tuple(rng.randint(0, 9) for _ in range(6)),
                           pinned=i == 17))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_same_hashes_as_request_by_request(seed: int) -> None:
    records = _records(seed)
    local = LocalAggregates(DECAY_TAU_S)
    for rec in records:
        local.add(rec, rec.timestamp)
    expected = _one_by_one(records, DECAY_TAU_S)
    assert local._hashes == expected  # the same floats: the same sums in the same order
    assert len(expected) == 3 and all(len(fields) > 20 for fields in expected.values())


def test_add_forward_adds_each_views_forward_decayed_value() -> None:
    """Forward decay as the module states it: x * exp((t - L) / tau) with L the era's
    landmark, in both views (the recent one 5x faster, prefix "f"), and the undecayed
    lifetime count; added to what the fields held."""
    t = 1.7e9 + 12345.6
    fields: dict[str, float] = {"all:known": 2.0}
    values = record_values(replace(BASE, timestamp=t))
    add_forward(fields, values, t, DECAY_TAU_S)
    expected = {"all:known": 2.0 + values["known"]}
    for prefix, tau in (("", DECAY_TAU_S), ("f", DECAY_TAU_S * RECENT_FRACTION)):
        era = int(t // (ERA_TAUS * tau))
        for name, value in values.items():
            expected[f"{prefix}{era}:{name}"] = value * math.exp((t - era * ERA_TAUS * tau) / tau)
    assert fields == expected
    assert forward_increments(values, t, DECAY_TAU_S) == {
        **{k: v for k, v in expected.items() if k != "all:known"}, "all:known": values["known"]}
