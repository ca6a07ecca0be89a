"""The world's step time: what one forward of the target costs for `batch` sequences
verifying `tokens` tokens in all (each sequence its k drafts plus one), from measured and
published tables, in a shape the policy does not assume.

The policy fits `step_time(k, load) = base + overhead * min(k, 1) + per_token * k`, linear
in k at each load (policies/cost.py). The world's step is instead saturating: a decode
step is memory-bound (the weights are read once whatever the batch, plus each sequence's
KV cache), so extra tokens in the forward are nearly free until the arithmetic catches
up with the memory traffic, after which time grows with tokens (compute-bound). At a
fixed batch that is convex in k — flat, then linear — and the knee moves with the batch
(`b (k + 1)` tokens), so no single per-token cost describes it.

- GPU engines (`sglang-h100`, `vllm-h100`): `t(b, T) = (1 + kv (b - 1)) * s(T) / s(1)`,
  `s(T) = (1 + (T / knee)^2)^(1/2)` (a smooth roofline: memory time 1, compute time T /
  knee). `knee` is fitted per engine, by least squares on log speedup, to every published
  speedup-by-batch row of that engine at once (`LOAD_ROWS`; SGLang: EAGLE-3 paper Table 3,
  EAGLE-3 and EAGLE-1 rows; vLLM: Table 5 and the vLLM blog's draft-model and n-gram
  figures), each row's drafter at its Table 1 tau and draft cost: one knee per engine,
  not one lambda per batch, so the world reproduces the tables only as well as a roofline
  can (residuals in `fit_report`, docs/POLICY.md). `kv` = 0.008 per extra sequence: a
  LLaMA-3.1-8B sequence of ~1k tokens holds 128 MB of bf16 KV (8 KV heads x 128 x 2 x 32
  layers x 2 bytes per token) against 16 GB of weights — an assumption, not a table.
- The embedded engine on this CPU (`embedded-cpu`): milliseconds per forward of
  SmolLM2-135M (float32, one thread, 200-token context) measured at batch 1 and 4 with
  1-16 tokens per sequence (docs/POLICY.md copies the table), as a function of tokens in
  the forward, interpolated piecewise linearly and extended past 64 tokens at the last
  segment's slope.

`LINEAR` is the policy's own form (the ideal world): plain(b) (1 + lambda(b) k), from
bench/sim/calibration.py.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from bench.sim.calibration import (
    PAPER_K,
    SGLANG_BATCH,
    SGLANG_EAGLE1,
    SGLANG_EAGLE3,
    VLLM_BATCH,
    VLLM_DRAFT,
    VLLM_EAGLE1,
    VLLM_EAGLE3,
    VLLM_NGRAM,
    draft_cost,
)

KV_PER_SEQUENCE = 0.008  # see the module docstring
# (batch, tokens per sequence, ms): REFERENCES forward cost, SmolLM2, 1 thread, float32
CPU_FORWARD_MS = ((1, 1, 61.0), (1, 4, 87.0), (1, 8, 99.0), (1, 16, 126.0),
                  (4, 1, 89.0), (4, 4, 169.0), (4, 8, 223.0), (4, 16, 346.0))
# engine -> rows of (reference method, tau at its paper depth, batches, speedups)
LOAD_ROWS = {
    "sglang-h100": (("eagle3", 6.13, SGLANG_BATCH, SGLANG_EAGLE3),
                    ("eagle", 3.98, SGLANG_BATCH, SGLANG_EAGLE1)),
    "vllm-h100": (("eagle3", 6.13, VLLM_BATCH, VLLM_EAGLE3),
                  ("eagle", 3.98, VLLM_BATCH, VLLM_EAGLE1),
                  ("draft", 2.27, VLLM_BATCH, VLLM_DRAFT),
                  ("ngram", 2.50, VLLM_BATCH, VLLM_NGRAM)),
}
KNEES = tuple(float(x) for x in np.geomspace(4.0, 2048.0, 120))
OVERHEADS = tuple(float(x) for x in np.linspace(0.0, 4.0, 81))


@dataclass(frozen=True, slots=True)
class StepLaw:
    """Seconds per verify step relative to one sequence decoding one token."""

    name: str
    knee: float = 0.0  # GPU: tokens in flight where compute time equals memory time
    kv: float = 0.0
    # GPU: per speculative step, the engine's own overhead beyond the verify forward and
    # the drafter's Table 1 cost (its draft forwards launched one per draft step, tree
    # and KV bookkeeping, rejection sampling), in batch-1 steps; whatever the method
    overhead: float = 0.0

    def step(self, batch: float, tokens: float) -> float:
        if batch <= 0:
            return 1.0
        if self.name == "embedded-cpu":
            return _cpu(tokens)
        return (1.0 + self.kv * (batch - 1.0)) * _roof(tokens, self.knee) / _roof(1.0, self.knee)


    def drafting(self, method: str) -> float:
        """The engine's fixed overhead of a speculative step (none for plain)."""
        return 0.0 if method == "plain" else self.overhead


MODEL_FREE = frozenset({"plain"})  # every drafting method pays the engine's step overhead


def _roof(tokens: float, knee: float) -> float:
    return math.sqrt(1.0 + (tokens / knee) ** 2)


@cache
def _cpu_points() -> tuple[tuple[float, ...], tuple[float, ...]]:
    by_tokens: dict[float, list[float]] = {}
    for batch, per_seq, ms in CPU_FORWARD_MS:
        by_tokens.setdefault(float(batch * per_seq), []).append(ms)
    xs = tuple(sorted(by_tokens))
    unit = float(np.mean(by_tokens[1.0]))
    return xs, tuple(float(np.mean(by_tokens[x])) / unit for x in xs)


def _cpu(tokens: float) -> float:
    xs, ys = _cpu_points()
    if tokens >= xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + slope * (tokens - xs[-1])
    i = max(bisect.bisect_right(xs, tokens) - 1, 0)
    return ys[i] + (ys[i + 1] - ys[i]) * (tokens - xs[i]) / (xs[i + 1] - xs[i])


def speedup(law: StepLaw, method: str, tau: float, batch: float) -> float:
    """The world's speedup of `method` at its paper depth over plain at `batch`."""
    k = PAPER_K[method]
    plain = law.step(batch, batch)
    spec = law.step(batch, batch * (k + 1)) + draft_cost(method) * k + law.drafting(method)
    return tau * plain / spec


def _error(law: StepLaw, rows) -> float:
    return sum((math.log(speedup(law, m, tau, b)) - math.log(s)) ** 2
               for m, tau, batches, speedups in rows for b, s in zip(batches, speedups, strict=True))


@cache
def law(name: str) -> StepLaw:
    """The calibrated law of an engine (the knee fitted once, cached)."""
    if name == "embedded-cpu":
        return StepLaw(name)
    rows = LOAD_ROWS[name]
    return min((StepLaw(name, knee, KV_PER_SEQUENCE, o) for knee in KNEES for o in OVERHEADS),
               key=lambda candidate: _error(candidate, rows))


def fit_report(name: str) -> list[tuple[str, float, float, float]]:
    """(method, batch, published speedup, the world's) for every row the knee was fitted
    to: how far the roofline is from the tables."""
    fitted = law(name)
    return [(m, float(b), float(s), speedup(fitted, m, tau, b))
            for m, tau, batches, speedups in LOAD_ROWS[name]
            for b, s in zip(batches, speedups, strict=True)]
