"""Event-loop lag: how late the gateway's event loop runs what is due.

A probe task asks to wake every `interval_s`; how much later than asked it wakes is the
loop's lag at that moment: time spent in callbacks that did not yield, or waiting for
the GIL while another thread (the policy's refit, the telemetry store) ran Python code
(CPython hands the GIL over every `sys.getswitchinterval()`, 5 ms by default). Samples
go to a Prometheus histogram (`specroute_event_loop_lag_seconds`) and a sliding window
whose p99 and max are gauges, so a stall shows on `/metrics` without a query language.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque

from prometheus_client import CollectorRegistry, Gauge, Histogram

BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


class LoopLagProbe:
    """Samples the loop's lag every `interval_s`; `window` samples make the gauges."""

    def __init__(self, registry: CollectorRegistry | None = None, interval_s: float = 0.02,
                 window: int = 3000) -> None:
        self.interval_s = interval_s
        self.samples: deque[float] = deque(maxlen=window)
        self.task: asyncio.Task | None = None
        self.histogram = self.p99_gauge = self.max_gauge = None
        if registry is not None:
            self.histogram = Histogram("specroute_event_loop_lag_seconds",
                                       "How late the event loop woke a timer", buckets=BUCKETS,
                                       registry=registry)
            self.p99_gauge = Gauge("specroute_event_loop_lag_p99_seconds",
                                   "p99 event-loop lag over the recent window",
                                   registry=registry)
            self.p99_gauge.set_function(lambda: self.summary()["p99_s"])
            self.max_gauge = Gauge("specroute_event_loop_lag_max_seconds",
                                   "Largest event-loop lag over the recent window",
                                   registry=registry)
            self.max_gauge.set_function(lambda: self.summary()["max_s"])

    def summary(self) -> dict[str, float]:
        """p50, p99 and max lag over the window (seconds), and the sample count."""
        ordered = sorted(self.samples)
        if not ordered:
            return {"p50_s": 0.0, "p99_s": 0.0, "max_s": 0.0, "samples": 0}
        n = len(ordered)
        return {"p50_s": ordered[n // 2], "p99_s": ordered[min(n - 1, int(0.99 * n))],
                "max_s": ordered[-1], "samples": n}

    def reset(self) -> None:
        self.samples.clear()

    async def run(self) -> None:
        while True:
            asked = time.perf_counter() + self.interval_s
            await asyncio.sleep(self.interval_s)
            lag = max(0.0, time.perf_counter() - asked)
            self.samples.append(lag)
            if self.histogram is not None:
                self.histogram.observe(lag)

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self.run(), name="loop-lag-probe")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.task = None
