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
  knee), plus per speculative step the drafter's Table 1 cost c d and the engine's own
  overhead: `per_draft_step` for each of the d draft forwards of a model drafter
  (`STEPPED`: EAGLE, EAGLE-2, EAGLE-3, the draft model, launched one per draft step)
  and `overhead` once per step for any drafter. `knee`, `per_draft_step` and `overhead`
  are fitted per engine, by least squares on log speedup, to every published
  speedup-by-batch row of that engine at once (`LOAD_ROWS`; SGLang: EAGLE-3 paper Table
  3, EAGLE-3 and EAGLE-1 rows; vLLM: Table 5 and the vLLM blog's draft-model and n-gram
  figures), each row's drafter at its Table 1 tau and draft cost: one knee per engine,
  not one lambda per batch, so the world reproduces the tables only as well as a roofline
  can (residuals in `fit_report`, docs/POLICY.md). Only rows of a drafter without draft
  forwards (vLLM's n-gram) tell the fixed part from the per-step part; vLLM's put all of
  it per draft step (fixed 0), and SGLang's rows (two model drafters) cannot tell, so
  SGLang's fixed part is held at vLLM's 0 (`FIXED_FROM`): a fixed 1.9 steps fits its
  rows 0.127 rms in log against 0.161, and would put EAGLE-3 k 1 at 0.6x plain at batch
  1-8, where SGLang ships k 1 as a candidate up to batch 63 (docs/POLICY.md). `kv` =
  0.008 per extra sequence: a LLaMA-3.1-8B sequence of ~1k tokens holds 128 MB of bf16
  KV (8 KV heads x 128 x 2 x 32 layers x 2 bytes per token) against 16 GB of weights —
  an assumption, not a table.
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
KNEES = np.geomspace(4.0, 2048.0, 120)
OVERHEADS = np.linspace(0.0, 4.0, 81)  # fixed, batch-1 steps per speculative step
PER_DRAFT_STEP = np.linspace(0.0, 1.0, 101)  # batch-1 steps per draft forward
# methods whose drafter runs one forward per draft step (the engine launches each)
STEPPED = frozenset({"eagle", "eagle2", "eagle3", "draft"})
# an engine whose rows cannot tell the fixed overhead from the per-step one takes the
# fixed part another engine's rows fitted (see the module docstring)
FIXED_FROM = {"sglang-h100": "vllm-h100"}


@dataclass(frozen=True, slots=True)
class StepLaw:
    """Seconds per verify step relative to one sequence decoding one token."""

    name: str
    knee: float = 0.0  # GPU: tokens in flight where compute time equals memory time
    kv: float = 0.0
    # GPU: per speculative step, the engine's own overhead beyond the verify forward and
    # the drafter's Table 1 cost (tree and KV bookkeeping, rejection sampling), in
    # batch-1 steps, whatever the method
    overhead: float = 0.0
    # GPU: per draft forward of a `STEPPED` drafter (launched one per draft step)
    per_draft_step: float = 0.0

    def step(self, batch: float, tokens: float) -> float:
        if batch <= 0:
            return 1.0
        if self.name == "embedded-cpu":
            return _cpu(tokens)
        return (1.0 + self.kv * (batch - 1.0)) * _roof(tokens, self.knee) / _roof(1.0, self.knee)


    def steps(self, batch: float, tokens: np.ndarray) -> np.ndarray:
        """`step` at each of `tokens` (one batch)."""
        if batch <= 0 or self.name == "embedded-cpu":
            return np.array([self.step(batch, float(t)) for t in tokens])
        return ((1.0 + self.kv * (batch - 1.0)) * np.sqrt(1.0 + (tokens / self.knee) ** 2)
                / _roof(1.0, self.knee))

    def drafting(self, method: str) -> float:
        """The engine's fixed overhead of a speculative step (none for plain)."""
        return 0.0 if method == "plain" else self.overhead

    def draft(self, method: str, depth: int) -> float:
        """A request's drafting per verify step at draft depth `depth`, in batch-1
        steps: the drafter's Table 1 cost c d plus the engine's per-draft-step overhead
        for a `STEPPED` drafter."""
        if depth <= 0 or method == "plain":
            return 0.0
        return (draft_cost(method) + (self.per_draft_step if method in STEPPED else 0.0)) * depth


MODEL_FREE = frozenset({"plain"})  # every drafting method pays the engine's step overhead


def drafting_cost(step_law: StepLaw | None, method: str, depth: int) -> float:
    """A request's drafting per verify step: `StepLaw.draft` under the world's law, the
    drafter's Table 1 cost c d alone under the policy's linear form (None)."""
    if step_law is None:
        return draft_cost(method) * depth if depth > 0 and method != "plain" else 0.0
    return step_law.draft(method, depth)


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
    spec = law.step(batch, batch * (k + 1)) + law.draft(method, k) + law.drafting(method)
    return tau * plain / spec


def _error(law: StepLaw, rows) -> float:
    return sum((math.log(speedup(law, m, tau, b)) - math.log(s)) ** 2
               for m, tau, batches, speedups in rows for b, s in zip(batches, speedups, strict=True))


@cache
def law(name: str) -> StepLaw:
    """The calibrated law of an engine (fitted once, cached): the grid of knee x fixed
    overhead x per-draft-step overhead searched at once (numpy), least squares on log
    speedup over every published row of the engine."""
    if name == "embedded-cpu":
        return StepLaw(name)
    fixed = OVERHEADS if name not in FIXED_FROM else np.array([law(FIXED_FROM[name]).overhead])
    knee, over, step = np.meshgrid(KNEES, fixed, PER_DRAFT_STEP, indexing="ij")
    error = np.zeros_like(knee)
    for method, tau, batches, speedups in LOAD_ROWS[name]:
        k = PAPER_K[method]
        per_step = step * k if method in STEPPED else 0.0
        for b, s in zip(batches, speedups, strict=True):
            def t(tokens: float, b: float = b) -> np.ndarray:
                return ((1.0 + KV_PER_SEQUENCE * (b - 1.0)) * np.sqrt(1.0 + (tokens / knee) ** 2)
                        / np.sqrt(1.0 + (1.0 / knee) ** 2))
            spec = t(b * (k + 1)) + draft_cost(method) * k + over + per_step
            error += (np.log(tau * t(b) / spec) - math.log(s)) ** 2
    i = np.unravel_index(int(np.argmin(error)), error.shape)
    return StepLaw(name, float(knee[i]), KV_PER_SEQUENCE, float(over[i]), float(step[i]))


def rms_log_residual(name: str) -> float:
    """Root mean square of log(world's speedup / published) over the engine's rows."""
    rows = LOAD_ROWS[name]
    return math.sqrt(_error(law(name), rows) / sum(len(r[2]) for r in rows))


def fit_report(name: str) -> list[tuple[str, float, float, float]]:
    """(method, batch, published speedup, the world's) for every row the knee was fitted
    to: how far the roofline is from the tables."""
    fitted = law(name)
    return [(m, float(b), float(s), speedup(fitted, m, tau, b))
            for m, tau, batches, speedups in LOAD_ROWS[name]
            for b, s in zip(batches, speedups, strict=True)]
