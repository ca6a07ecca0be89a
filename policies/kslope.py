"""Acceptance that rises with k, and a fresh view of acceptance for change detection.

**The slope.** E(a, k) takes one i.i.d. `a` per context. Measured on the embedded engine
(docs/POLICY.md, world calibration), an accepted run tends to continue (the chain
drafters' conditional acceptance rises by position) and prompts differ (easy ones accept
deeply), so the `a` inverted from the accept length at k grows with k: read at one k and
extrapolated to a larger one, E(a, k) falls short (the policy ran n-gram at k 5-8 on
greedy edits where k 12 was best). Per context, the slope of logit(a) in log(depth) (a
tree's accepted depth, a chain's k) is fitted by weighted least squares over the depths
with `min_steps` verify steps each, shrunk towards 0 (i.i.d.) by a ridge on the spread
of log depth and clamped to `bounds`. Its data mix time with k: after a drift the old a
sits at the old k and reads as a slope, so the learner fits none for a context that
drifted within the telemetry's time constant (`Learner`).

**The fresh view.** Each refit takes what the telemetry gained since the last one (the
forward-decayed sums read twice: now, less the previous read decayed over the interval)
and adds it to per-context sums that fade `fresh_fraction` times faster than the
telemetry (12 s at the gateway's 300 s): what the last seconds of requests accepted.
The telemetry's own recent view (60 s) took most of a 25 s phase to move past the
drift threshold; this one moves within a few seconds of the first finished requests.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping

from policies.acceptance import A_MAX, draft_depth, invert_accept_length
from policies.aggregates import ContextKey, ContextStats
from policies.prior import AcceptKey

Tilt = tuple[float, float]  # (slope of logit(a) in log depth, the data's mean log depth)


def tilted_accept(a: float, depth: int, tilt: Tilt | None) -> float:
    """`a` (the context's, at its data's mean log depth) read at `depth` along the slope."""
    if tilt is None or depth <= 0 or not 0.0 < a < A_MAX:
        return a
    logit = math.log(a / (1.0 - a)) + tilt[0] * (math.log(depth) - tilt[1])
    return min(1.0 / (1.0 + math.exp(-logit)), A_MAX)


def slope(by_depth: Mapping[int, tuple[float, float]], ridge: float,
          bounds: tuple[float, float]) -> Tilt | None:
    """From (tokens, verify steps) per depth: the ridge-shrunk slope of logit(a) in log
    depth and the steps-weighted mean log depth; None with fewer than two depths."""
    points = []
    for depth, (tokens, steps) in by_depth.items():
        a = min(max(invert_accept_length(tokens / steps, depth), 1e-3), A_MAX)
        points.append((math.log(depth), math.log(a / (1.0 - a)), steps))
    if len(points) < 2:
        return None
    weight = sum(w for _, _, w in points)
    mx = sum(x * w for x, _, w in points) / weight
    my = sum(y * w for _, y, w in points) / weight
    sxy = sum(w * (x - mx) * (y - my) for x, y, w in points) / weight
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points) / weight
    return min(max(sxy / (sxx + ridge), bounds[0]), bounds[1]), mx


class KWindow:
    """`update` once per refit: per acceptance context its slope in k (long view) and
    `fresh`: the last seconds' (a x steps, steps, requests), a inverted at each k."""

    def __init__(self, ridge: float = 0.02, bounds: tuple[float, float] = (-0.5, 1.0),
                 min_steps: float = 20.0, fresh_fraction: float = 0.04,
                 pooled: bool = False) -> None:
        self.ridge, self.bounds, self.min_steps = ridge, bounds, min_steps
        self.pooled = pooled  # one context for every class (`ContextKey.accept_key`)
        self.fresh_fraction = fresh_fraction
        self.fresh: dict[AcceptKey, list[float]] = {}
        self._last: dict[str, ContextStats] = {}
        self._at: float | None = None

    def update(self, snapshot: Mapping[str, ContextStats], now: float, tau_s: float,
               depths: Mapping[str, int]) -> dict[AcceptKey, Tilt]:
        fade = math.exp(-(now - self._at) / tau_s) if self._at is not None else None
        if fade is not None:
            quick = fade ** (1.0 / self.fresh_fraction)
            for sums in self.fresh.values():
                sums[:] = [s * quick for s in sums]
        per_depth: dict[AcceptKey, dict[int, list[float]]] = defaultdict(
            lambda: defaultdict(lambda: [0.0, 0.0]))
        for name, stats in snapshot.items():
            ctx = ContextKey.decode(name)
            depth = draft_depth(ctx.method, ctx.k, depths)
            if depth < 1 or ctx.method == "plain" or stats.steps <= 0:
                continue
            key = ctx.accept_key(self.pooled)
            whole = per_depth[key][depth]
            whole[0] += stats.tokens
            whole[1] += stats.steps
            if fade is not None:
                self._add_fresh(key, depth, stats, self._last.get(name), fade)
        self._last, self._at = dict(snapshot), now
        out = {}
        for key, by_depth in per_depth.items():
            kept = {d: (t, s) for d, (t, s) in by_depth.items() if s >= self.min_steps}
            tilt = slope(kept, self.ridge, self.bounds)
            if tilt is not None:
                out[key] = tilt
        return out

    def _add_fresh(self, key: AcceptKey, depth: int, stats: ContextStats,
                   prev: ContextStats | None, fade: float) -> None:
        old = (prev.known, prev.steps, prev.tokens) if prev is not None else (0.0,) * 3
        known = stats.known - old[0] * fade
        steps, tokens = stats.steps - old[1] * fade, stats.tokens - old[2] * fade
        if known < 0.5 or steps <= 0 or tokens < steps:  # nothing new (or float dust)
            return
        sums = self.fresh.setdefault(key, [0.0, 0.0, 0.0])
        sums[0] += invert_accept_length(tokens / steps, depth) * steps
        sums[1] += steps
        sums[2] += known
