"""What the simulated world does that the policy's model does not assume.

The policy predicts with one per-token acceptance `a` per (method, task, temperature
bucket) and the i.i.d. chain law E(a, k) = (1 - a^(k+1)) / (1 - a) (arXiv 2211.17192).
The world breaks each of those assumptions, by amounts measured or published
(bench/sim/calibration.py, sources in docs/POLICY.md):

- **per-prompt acceptance**: a request's acceptance is drawn around its class value,
  logit(a_prompt) = logit(a_class) + sigma_method * z, with z ~ N(0, 1) per request and
  per drafter family — one z for drafters trained on the target's outputs (EAGLE*,
  Medusa, draft model), one for drafters that copy from the text (n-gram, lookahead),
  correlated by `family_correlation`: a prompt easy for n-gram (input-grounded) is not
  the same prompt that is easy for EAGLE;
- **positional decay**: the i-th draft token of a step is rejected, given the ones before
  it were accepted, with probability (1 - a) * growth^(i-1) (the rejection rate grows
  with draft depth, as drafts condition on more of their own guesses), so accept runs
  are longer near the root and shorter at depth than the chain law says;
- **tree saturation**: tree drafters (EAGLE-2, Medusa, lookahead) spend k on tree nodes;
  accept length stops growing at the tree's depth whatever k is, while every node is
  still verified;
- **classifier errors**: the router sees the classifier's label, drawn from the measured
  confusion matrix; the world decodes the true task.

Class values are calibrated so that at the paper's draft depth the world reproduces the
paper's tokens per step (tau); the per-prompt draw is centred on the class value in logit
space (its median, not its mean). Co-batching cost lives in bench/sim/simulator.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from bench.sim.calibration import (
    CLASSIFIER_CONFUSION,
    FAMILY_CORRELATION,
    PAPER_TREE_DEPTH,
    PROMPT_LOGIT_STD,
    REJECT_GROWTH,
    class_target,
    true_accept,
)

TEXT_DRAFTERS = frozenset({"ngram", "lookahead"})
A_CAP = 0.995
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(12)  # E over z ~ N(0, 1)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


@dataclass(frozen=True, slots=True)
class World:
    """Which departures from the policy's model are on; `ideal()` is the policy's model."""

    prompt_spread: bool = True
    positional: bool = True
    tree_saturation: bool = True
    classifier_errors: bool = True
    co_batching: bool = True  # off: each request steps at the cost of its own k
    # the engines' step law from measured/published tables, saturating (bench/sim/
    # steplaw.py); off: the policy's own form, linear in k at each load
    measured_steps: bool = True

    @classmethod
    def ideal(cls) -> World:
        return cls(False, False, False, False, False, False)

    def decay(self, method: str) -> float:
        """Growth of the rejection rate per draft position (1 = the i.i.d. chain)."""
        return REJECT_GROWTH.get(method, 1.0) if self.positional else 1.0

    def depth(self, method: str, k: int) -> int:
        """Draft tokens that can be accepted in one step with k drafted (tree nodes)."""
        if self.tree_saturation and method in PAPER_TREE_DEPTH:
            return min(k, PAPER_TREE_DEPTH[method])
        return k

    def spread(self, method: str) -> float:
        return PROMPT_LOGIT_STD.get(method, 0.0) if self.prompt_spread else 0.0

    def class_first_accept(self, method: str, task: str, bucket: str) -> float:
        """a of the first draft position for the class: reproduces the paper's tau."""
        return _first_accept(method, task, bucket, self.decay(method))

    def prompt_accept(self, method: str, task: str, bucket: str, z_model: float,
                      z_text: float, scale: float = 1.0) -> float:
        """This request's first-position acceptance (`scale`: drafter degradation)."""
        a = self.class_first_accept(method, task, bucket)
        z = z_text if method in TEXT_DRAFTERS else z_model
        return min(_shift(a, self.spread(method) * z) * scale, A_CAP)

    def expected_accept_length(self, method: str, task: str, bucket: str, k: int,
                               scale: float = 1.0) -> float:
        """Tokens per step for the class, averaged over its prompts (the oracle's view)."""
        return _class_length(self, method, task, bucket, k, round(scale, 4))

    def label_draws(self, rng: np.random.Generator, tasks: list[str]) -> list[str]:
        """The classifier's label per request (the true task when errors are off)."""
        if not self.classifier_errors:
            return list(tasks)
        columns = list(CLASSIFIER_CONFUSION["chat"])
        uniforms = rng.random(len(tasks))
        out = []
        for task, u in zip(tasks, uniforms, strict=True):
            cumulative = np.cumsum([CLASSIFIER_CONFUSION[task][c] for c in columns])
            out.append(columns[min(int(np.searchsorted(cumulative, u * cumulative[-1])),
                                   len(columns) - 1)])
        return out

    def family_draws(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """(n, 2): z for trained drafters and z for text drafters, correlated."""
        rho = FAMILY_CORRELATION
        cov = np.array([[1.0, rho], [rho, 1.0]])
        return rng.multivariate_normal(np.zeros(2), cov, size=n)


def position_accept(a: float, decay: float, depth: int) -> np.ndarray:
    """(depth,): P(draft i accepted | drafts before it accepted) = 1 - (1 - a) decay^i."""
    return np.clip(1.0 - (1.0 - a) * decay ** np.arange(depth), 0.0, A_CAP)


def positional_length(a: float, decay: float, depth: int) -> float:
    """Expected tokens per step (bonus included) under the positional law, up to `depth`
    drafts."""
    return 1.0 + float(np.cumprod(position_accept(a, decay, depth)).sum()) if depth > 0 else 1.0


def sample_accepted(rng: np.random.Generator, a: float, decay: float, depth: int,
                    size: int) -> np.ndarray:
    """Accepted drafts per step for `size` steps under the positional law."""
    if depth <= 0 or a <= 0.0:
        return np.zeros(size, dtype=np.int64)
    p = position_accept(a, decay, depth)  # (depth,)
    accepted = rng.random((size, depth)) < p  # (size, depth)
    run = np.cumprod(accepted, axis=1)  # stays 1 until the first rejection
    return run.sum(axis=1)


def sample_steps(rng: np.random.Generator, a: float, decay: float, depth: int,
                 tokens: int) -> int:
    """Verify steps to emit `tokens` (each step emits accepted drafts + 1)."""
    if depth <= 0 or a <= 0.0:
        return tokens
    expected = positional_length(a, decay, depth)
    size = int(tokens / expected + 4 * np.sqrt(tokens) + 8)
    filled = np.cumsum(sample_accepted(rng, a, decay, depth, size) + 1)
    if filled[-1] < tokens:
        return size + sample_steps(rng, a, decay, depth, tokens - int(filled[-1]))
    return int(np.searchsorted(filled, tokens) + 1)


def _shift(a: float, delta: float) -> float:
    a = min(max(a, 1e-4), A_CAP)
    return float(1.0 / (1.0 + np.exp(-(np.log(a / (1.0 - a)) + delta))))


@cache
def _first_accept(method: str, task: str, bucket: str, decay: float) -> float:
    """Bisection on a: positional_length(a, decay, paper depth) = the i.i.d. law's E at the
    paper's depth for the class's Table 1 acceptance (true_accept)."""
    target, depth = class_target(method, task, bucket)
    if decay == 1.0:
        return true_accept(method, task, bucket)
    low, high = 0.0, A_CAP
    for _ in range(50):
        mid = 0.5 * (low + high)
        if positional_length(mid, decay, depth) < target:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


@cache
def _class_length(world: World, method: str, task: str, bucket: str, k: int,
                  scale: float) -> float:
    if k <= 0:
        return 1.0
    a = world.class_first_accept(method, task, bucket)
    sigma, decay, depth = world.spread(method), world.decay(method), world.depth(method, k)
    return float(sum(w * positional_length(min(_shift(a, sigma * z) * scale, A_CAP), decay,
                                           depth) for z, w in zip(_NODES, _WEIGHTS, strict=True)))
