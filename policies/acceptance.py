"""Per-token acceptance: the expected-accept-length formula, its inverse, and a prior.

Notation (Leviathan et al. 2023, arXiv 2211.17192): `a` is the per-token probability that
a drafted token is accepted (i.i.d.), `k` the number of drafted tokens per verify step,
`E(a, k) = (1 - a^(k+1)) / (1 - a)` the expected tokens per verify step, bonus token
included (SGLang's `spec_accept_length = completion_tokens / spec_verify_ct`).

The inverse is monotone in `a`, so bisection is exact and safe at both ends: E <= 1 means
nothing is accepted (a = 0), E >= k + 1 means everything is (a = 1).
`AcceptancePrior` is a scikit-learn regressor from request features to `a`, so a context
with few observations borrows from similar ones (same method other task, same task other
method); `blend` mixes the two by observation count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

A_MAX = 0.995  # keeps E(a, k) finite-slope and the inverse well defined
TEMPERATURE_BUCKETS = ("t0", "tlow", "thigh")


def expected_accept_length(a: float, k: int) -> float:
    """E(a, k): expected tokens per verify step with k drafts (arXiv 2211.17192, eq. 1)."""
    if k <= 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def invert_accept_length(mean_accept_length: float, k: int, iterations: int = 50) -> float:
    """The `a` with E(a, k) = mean_accept_length, by bisection; clamped to [0, A_MAX]."""
    if k <= 0 or mean_accept_length <= 1.0:
        return 0.0
    if mean_accept_length >= expected_accept_length(A_MAX, k):
        return A_MAX
    low, high = 0.0, A_MAX
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        if expected_accept_length(mid, k) < mean_accept_length:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def blend(a_context: float, n_context: float, a_prior: float, prior_weight: float) -> float:
    """Posterior-mean style mix: the context's own estimate wins as its count grows."""
    total = n_context + prior_weight
    if total <= 0:
        return a_prior
    return (n_context * a_context + prior_weight * a_prior) / total


def acceptance_std(a: float, n: float) -> float:
    """Rough standard error of an acceptance estimate from n requests (Beta-like)."""
    return math.sqrt(max(a * (1.0 - a), 0.01) / (n + 1.0))


@dataclass(frozen=True, slots=True)
class AcceptanceSample:
    """One acceptance context's estimate: the regressor's training row."""

    method: str
    task: str
    temperature_bucket: str
    k: float
    a: float
    weight: float


def logit(a: float | np.ndarray) -> float | np.ndarray:
    a = np.clip(a, 0.01, A_MAX)
    return np.log(a / (1.0 - a))


class AcceptancePrior:
    """Ridge regression on logit(a) over one-hot (method, task) plus temperature and k.

    The target is the residual against a per-method base rate (`method_base`), so a
    method never observed starts from its base rate plus the task and temperature
    effects learned from the others.

    An additive model in logit space encodes the effects that transfer to an unseen
    combination (chat accepts less than code for every method; T1 less than T0; a given
    drafter is strong or weak across tasks), is well-posed with a handful of contexts, and
    fits in about a millisecond (the learner refits every second). Fitted in the learner's
    thread, never on the request path.
    """

    def __init__(self, method_base: Callable[[str], float], min_samples: int = 4) -> None:
        self.method_base = method_base
        self.min_samples = min_samples
        self._methods: list[str] = []
        self._tasks: list[str] = []
        self._model = None

    def _features(self, method: str, task: str, bucket: str, k: float) -> list[float]:
        row = [1.0 if method == m else 0.0 for m in self._methods]
        row += [1.0 if task == t else 0.0 for t in self._tasks]
        row.append(float(TEMPERATURE_BUCKETS.index(bucket)) if bucket in TEMPERATURE_BUCKETS
                   else 1.0)
        row.append(float(k))
        return row

    def fit(self, samples: Sequence[AcceptanceSample]) -> AcceptancePrior:
        if len(samples) < self.min_samples:
            self._model = None
            return self
        from sklearn.linear_model import Ridge

        self._methods = sorted({s.method for s in samples})
        self._tasks = sorted({s.task for s in samples})
        x = np.array([self._features(s.method, s.task, s.temperature_bucket, s.k)
                      for s in samples])
        residual = np.array([logit(s.a) - logit(self.method_base(s.method)) for s in samples])
        w = np.array([min(s.weight, 50.0) for s in samples])
        model = Ridge(alpha=0.3)
        model.fit(x, residual, sample_weight=w)
        self._model = model
        return self

    def predict_many(self, rows: Iterable[tuple[str, str, str, float]]) -> list[float]:
        """Predicted `a` per (method, task, temperature_bucket, k); base rates if unfitted."""
        rows = list(rows)
        base = np.array([logit(self.method_base(row[0])) for row in rows])
        if self._model is None or not rows:
            return [self.method_base(row[0]) for row in rows]
        x = np.array([self._features(*row) for row in rows])
        a = 1.0 / (1.0 + np.exp(-(base + self._model.predict(x))))
        return [float(v) for v in np.clip(a, 0.0, A_MAX)]
