"""Counters and histograms for the request path: plain numbers, read at scrape.

`prometheus_client`'s Counter and Histogram take a lock on every update and check the
metric's state on every call, and a finished request updates 14 of them (8 histogram
observations): a visible share of the gateway's CPU a request (docs/PERFORMANCE.md). These
keep a list of counts per label set, bumped on the event loop that records every
request, and turn them into metric families only when `/metrics` is scraped (also on
the event loop: no lock is needed). The exposition is the library's, so the series,
their names, labels and `le` bounds read as before; not kept: the `_created` series.

    requests = Counter("specroute_requests", "Finished requests", ("pool",), registry)
    requests.labels("eagle").inc()
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket, not cumulative; last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # le: value <= bound
        self.sum += value


class _Series:
    """One metric: its children by label values; a collector for `registry`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.children: dict[tuple[str, ...], CounterChild | HistogramChild] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: object):  # noqa: ANN201 - the child type of the subclass
        key = tuple(str(value) for value in values)
        if len(key) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {key}")
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = self._child()
        return child

    def _child(self) -> CounterChild | HistogramChild:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError

    def describe(self) -> list[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for key, child in list(self.children.items()):
            self._add(family, list(key), child)
        yield family

    def _add(self, family: Metric, labels: list[str], child: CounterChild | HistogramChild
             ) -> None:
        raise NotImplementedError


class Counter(_Series):
    """A counter by label values (`specroute_x` is exposed as `specroute_x_total`)."""

    def _child(self) -> CounterChild:
        return CounterChild()

    def _family(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: CounterChild | HistogramChild
             ) -> None:
        family.add_metric(labels, child.value)  # type: ignore[attr-defined, union-attr]


class Histogram(_Series):
    """A histogram by label values, `buckets` its upper bounds (+Inf added)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None, buckets: Sequence[float]) -> None:
        self.bounds = tuple(sorted(float(bound) for bound in buckets
                                   if bound != float("inf")))
        self._les = [floatToGoString(bound) for bound in (*self.bounds, float("inf"))]
        super().__init__(name, documentation, labelnames, registry)

    def _child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _family(self) -> Metric:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def _add(self, family: Metric, labels: list[str], child: CounterChild | HistogramChild
             ) -> None:
        assert isinstance(child, HistogramChild)
        running, buckets = 0, []
        for le, count in zip(self._les, child.counts, strict=True):
            running += count
            buckets.append((le, running))
        family.add_metric(labels, buckets, child.sum)  # type: ignore[attr-defined]
