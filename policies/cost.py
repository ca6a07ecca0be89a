"""Step-cost model: seconds per verify step as a function of k and per-worker load.

tokens/s = E(a, k) / step_time(k, load). Within one load slot a verify step costs
`base + per_token * k`, where `k` is the batch's draft tokens per request (the mean over
the batch-mates, the request's own k included): the verify pass carries every request's
drafts and the draft passes run batched, so one request's k slows its whole batch. The
worker reports that mean (`RequestRecord.batch_draft_tokens`); where it does not (SGLang,
vLLM: every request of a pool runs the pool's k) it is the request's own k. Both terms grow with load, and not linearly — verifying k + 1
tokens per sequence is nearly free while the target is memory-bound and costly once the
batch makes it compute-bound (EAGLE-3 arXiv 2503.01840 Table 3, vLLM Table 5), and the
published curves flatten past a batch of ~32. So the model is piecewise linear in load:
one (base, per_token) pair per load knot (1, 2, 4, ... 128 per worker), interpolated.

Fitting: a trend (base and per_token each linear in load) by weighted least squares,
shrunk to a generic shape, then all knots at once by penalised least squares (smooth
across knots, weakly anchored to the trend). A pool with no data follows the fleet.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

K_SCALE = 8.0  # feature scaling keeps the ridge penalties comparable across terms
LOAD_SCALE = 32.0
LOAD_KNOTS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


@dataclass(frozen=True, slots=True)
class StepSample:
    k: float  # the batch's draft tokens per request (its own k where unreported)
    load: float  # requests per worker (the batch the request joined)
    step_s: float
    weight: float  # requests behind the mean (decayed)
    slot: int = 0  # load bucket the sample came from


@dataclass(frozen=True, slots=True)
class StepCost:
    """step_s(k, load) = base(load) + overhead(load) * min(k, 1) + per_token(load) * k,
    interpolated over load knots. `overhead` is what drafting costs at any k (a draft
    head's forward, lookahead's window): measured by the workers' batch benchmark, else 0;
    min(k, 1) because `k` is the batch's mean and a batch mixing plain requests runs the
    drafter for part of it."""

    loads: tuple[float, ...]
    base: tuple[float, ...]
    per_token: tuple[float, ...]
    overhead: tuple[float, ...] = ()

    def step_s(self, k: float, load: float) -> float:
        """At `k` draft tokens per request across a batch of `load` requests."""
        i = bisect.bisect_left(self.loads, load)
        if i <= 0:
            lo_i = hi_i = 0
            w = 0.0
        elif i >= len(self.loads):
            lo_i = hi_i = len(self.loads) - 1
            w = 0.0
        else:
            lo_i, hi_i = i - 1, i
            lo, hi = self.loads[lo_i], self.loads[hi_i]
            w = (load - lo) / (hi - lo) if hi > lo else 1.0

        def at(values: tuple[float, ...]) -> float:
            return values[lo_i] + w * (values[hi_i] - values[lo_i])

        step = at(self.base) + at(self.per_token) * k
        if self.overhead and k > 0:
            step += at(self.overhead) * min(k, 1.0)
        return max(step, 1e-4)


@dataclass(frozen=True, slots=True)
class Trend:
    """base = b0 + b1 * load', per_token = p0 + p1 * load' (load' = load / LOAD_SCALE)."""

    b0: float
    b1: float
    p0: float
    p1: float

    def at(self, load: float) -> tuple[float, float]:
        ll = load / LOAD_SCALE
        return self.b0 + self.b1 * ll, self.p0 + self.p1 * ll

    def step_s(self, k: float, load: float) -> float:
        base, per_token = self.at(load)
        return base + per_token * k

    def curve(self, loads: Sequence[float] = LOAD_KNOTS) -> StepCost:
        pairs = [self.at(load) for load in loads]
        return StepCost(tuple(loads), tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


def generic_trend(base_step_s: float) -> Trend:
    """Shape-only prior: 5% of a step per draft token (c = 0.05, arXiv 2211.17192's example),
    step time doubling by 64 requests per worker, per-token cost tripling by then."""
    return Trend(base_step_s, base_step_s * 0.5, base_step_s * 0.05, base_step_s * 0.05)


def _ridge(x: np.ndarray, y: np.ndarray, w: np.ndarray, prior: np.ndarray,
           strength: float) -> np.ndarray:
    xtw = x.T * w
    return np.linalg.solve(xtw @ x + strength * np.eye(len(prior)), xtw @ y + strength * prior)


def fit_trend(samples: Sequence[StepSample], prior: Trend, strength: float = 0.2) -> Trend:
    if not samples:
        return prior
    x = np.array([[1.0, s.load / LOAD_SCALE, s.k / K_SCALE, s.k / K_SCALE * s.load / LOAD_SCALE]
                  for s in samples])
    y = np.array([s.step_s for s in samples])
    w = np.array([s.weight for s in samples])
    w = w / w.max()
    prior_vec = np.array([prior.b0, prior.b1, prior.p0 * K_SCALE, prior.p1 * K_SCALE])
    b0, b1, p0, p1 = map(float, _ridge(x, y, w, prior_vec, strength))
    return Trend(max(b0, 1e-4), max(b1, 0.0), max(p0 / K_SCALE, 0.0), max(p1 / K_SCALE, 0.0))


def hat_basis(load: float, knots: Sequence[float]) -> np.ndarray:
    """Piecewise-linear interpolation weights of `load` on `knots` (constant past the ends)."""
    out = np.zeros(len(knots))
    if load <= knots[0]:
        out[0] = 1.0
    elif load >= knots[-1]:
        out[-1] = 1.0
    else:
        i = bisect.bisect_right(knots, load)
        w = (load - knots[i - 1]) / (knots[i] - knots[i - 1])
        out[i - 1], out[i] = 1.0 - w, w
    return out


Ratios = tuple[tuple[float, float], ...]  # per knot: (per_token, overhead) / plain's step


def curve_ratios(points: Sequence[tuple[float, float, float, float]]) -> Ratios:
    """Per load knot, a drafted token's cost and drafting's fixed cost as fractions of
    plain's step at that load, from measured (batch, base, per_token, overhead) points:
    interpolated between measured batches, held at the nearest one outside them."""
    batches = [p[0] for p in points]
    ratios = [(p[2] / p[1], p[3] / p[1]) for p in points]
    out = []
    for load in LOAD_KNOTS:
        if load <= batches[0]:
            out.append(ratios[0])
        elif load >= batches[-1]:
            out.append(ratios[-1])
        else:
            i = bisect.bisect_right(batches, load)
            w = (load - batches[i - 1]) / (batches[i] - batches[i - 1])
            (p0, o0), (p1, o1) = ratios[i - 1], ratios[i]
            out.append((p0 + w * (p1 - p0), o0 + w * (o1 - o0)))
    return tuple(out)


def fit_step_cost(samples: Sequence[StepSample], trend_prior: Trend,
                  smoothness: float = 2.0, anchor: float = 0.05,
                  ratios: Ratios | None = None,
                  ratio_weight: float = 5.0) -> tuple[StepCost, Trend]:
    """One weighted least-squares fit of (base, per_token) at every load knot.

    Each sample enters at its own load through the hat basis, so load spread inside a
    bucket is not mistaken for a k effect. A second-difference penalty (`smoothness`, in
    requests' worth) makes knots without data continue the neighbours' line, and a weak
    pull (`anchor`) to this pool's trend keeps the system well posed with little data.
    With measured `ratios` (the workers' batch benchmark, `curve_ratios`: a draft token's
    cost and drafting's fixed cost as fractions of plain's step, per knot) each knot's
    per-token cost and fixed overhead are pulled to those fractions of the knot's fitted
    base with `ratio_weight` requests' worth instead:
    a pool's own traffic seldom varies k enough at one load to show what a draft token
    costs there, and the trend's straight line in load cannot follow a measured curve.
    The ratio, not the benchmark's seconds, carries over: absolute step times differ
    between the benchmark and traffic (prompt lengths, other load on the machine).
    """
    trend = fit_trend(samples, trend_prior)
    knots = LOAD_KNOTS
    m = len(knots)
    if not samples:
        curve = trend.curve(knots)
        if ratios is None:
            return curve, trend
        return StepCost(curve.loads, curve.base,
                        tuple(b * r[0] for b, r in zip(curve.base, ratios, strict=True)),
                        tuple(b * r[1] for b, r in zip(curve.base, ratios, strict=True))), trend
    blocks = 2 if ratios is None else 3  # base, per_token[, overhead] per knot
    rows, y, w = [], [], []
    for s in samples:
        phi = hat_basis(s.load, knots)
        parts = [phi, phi * s.k / K_SCALE]
        if ratios is not None:
            parts.append(phi * min(max(s.k, 0.0), 1.0))
        rows.append(np.concatenate(parts))
        y.append(s.step_s)
        w.append(s.weight)
    x, yv, wv = np.array(rows), np.array(y), np.array(w)
    size = blocks * m
    prior = np.zeros(size)
    prior[:m] = [trend.at(load)[0] for load in knots]
    prior[m:2 * m] = [trend.at(load)[1] * K_SCALE for load in knots]
    pull = np.full(size, anchor)
    second = np.zeros((m - 2, m))
    for i in range(m - 2):
        second[i, i:i + 3] = (1.0, -2.0, 1.0)
    penalty = np.zeros((size, size))
    for block in range(blocks):
        part = slice(block * m, (block + 1) * m)
        penalty[part, part] = smoothness * second.T @ second
    if ratios is not None:  # per_token_i - r_i * base_i and overhead_i - o_i * base_i
        pull[m:] = 0.0
        for i, (ratio, overhead) in enumerate(ratios):
            for block, scale in ((1, ratio * K_SCALE), (2, overhead)):
                u = np.zeros(size)
                u[block * m + i], u[i] = 1.0, -scale
                penalty += ratio_weight * np.outer(u, u)
    penalty += np.diag(pull)
    xtw = x.T * wv
    theta = np.linalg.solve(xtw @ x + penalty, xtw @ yv + pull * prior)
    base = tuple(max(float(v), 1e-4) for v in theta[:m])
    per_token = tuple(max(float(v) / K_SCALE, 0.0) for v in theta[m:2 * m])
    fixed = tuple(max(float(v), 0.0) for v in theta[2 * m:]) if ratios is not None else ()
    return StepCost(tuple(knots), base, per_token, fixed), trend
