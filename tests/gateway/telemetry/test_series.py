"""The request path's counters and histograms (gateway/telemetry/series.py) expose what
`prometheus_client`'s own would for the same updates, `_created` series aside."""

from __future__ import annotations

import random

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gateway.telemetry import series

BUCKETS = (0.005, 0.01, 0.1, 1, 2.5, 10)


def exposition(module) -> list[str]:  # noqa: ANN001 - either module
    registry = CollectorRegistry()
    requests = module.Counter("x_requests", "Requests", ("pool", "ok"), registry=registry)
    seconds = module.Histogram("x_seconds", "Seconds", ("pool",), registry=registry,
                               buckets=BUCKETS)
    draw = random.Random(7)
    for _ in range(500):
        pool = draw.choice(["eagle", "ngram", "plain"])
        requests.labels(pool, str(draw.random() < 0.9).lower()).inc()
        requests.labels(pool, "tokens").inc(draw.randint(1, 64))
        # bounds themselves, values between them, and past the last one
        seconds.labels(pool).observe(draw.choice([*BUCKETS, draw.random() * 12]))
    return [line for line in generate_latest(registry).decode().splitlines()
            if "_created" not in line]


def test_the_exposition_is_the_librarys() -> None:
    ours, theirs = exposition(series), exposition(prometheus_client)
    assert sorted(ours) == sorted(theirs)
    assert any('le="+Inf"' in line for line in ours)


def test_labels_are_checked_and_counters_only_rise() -> None:
    registry = CollectorRegistry()
    counter = series.Counter("y_total_things", "Things", ("a",), registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("one", "two")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("one").inc(-1)
    with pytest.raises(ValueError, match="Duplicated"):  # the registry's own name check
        series.Counter("y_total_things", "Again", ("a",), registry=registry)
