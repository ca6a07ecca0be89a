"""Per-token acceptance: the expected-accept-length formula, its inverse, and a prior.

Notation (Leviathan et al. 2023, arXiv 2211.17192): `a` is the per-token probability that
a drafted token is accepted (i.i.d.), `k` the number of drafted tokens per verify step,
`E(a, k) = (1 - a^(k+1)) / (1 - a)` the expected tokens per verify step, bonus token
included (SGLang's `spec_accept_length = completion_tokens / spec_verify_ct`).

The inverse is monotone in `a`, so bisection is exact and safe at both ends: E <= 1 means
nothing is accepted (a = 0), E >= k + 1 means everything is (a = 1).
`blend` mixes a context's own estimate with its prior (policies/prior.py: what the
workers measured) by observation count.

Tree drafters (EAGLE-2 arXiv 2406.16858, Medusa arXiv 2401.10774, lookahead arXiv
2402.02057) spend k on tree nodes, but a step can accept at most one path, as deep as the
tree: accept length stops growing at the tree's depth while every node is still
verified. So a method's accept length is E(a, draft_depth(method, k)), predicted and
inverted alike. The depths are the embedded drafters' (workers/embedded/speculative/):
EAGLE-2 expands `min(depth 5, k)` levels, Medusa has 4 heads (one depth each), lookahead
verifies (N - 1)-grams with N = 4. SGLang's EAGLE-2 counts k as `num_draft_tokens` (tree
nodes) and its depth is `num_steps`, a separate launch flag; where telemetry shows a
longer accepted run than the table allows, the learner raises the depth
(`observed_depth`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from policies.methods import TREE_DEPTH

A_MAX = 0.995  # keeps E(a, k) finite-slope and the inverse well defined
TEMPERATURE_BUCKETS = ("t0", "tlow", "thigh")


def draft_depth(method: str, k: int, depths: Mapping[str, int] | None = None) -> int:
    """Draft tokens one verify step can accept with k drafted: k for chain drafters, at
    most the tree's depth for tree drafters (`depths` overrides TREE_DEPTH per method)."""
    depth = (depths or {}).get(method, TREE_DEPTH.get(method))
    return k if depth is None else min(k, depth)


def method_accept_length(a: float, method: str, k: int,
                         depths: Mapping[str, int] | None = None) -> float:
    """Expected tokens per verify step for `method` at k: E(a, its accepted depth)."""
    return expected_accept_length(a, draft_depth(method, k, depths))


def invert_method_accept_length(mean_accept_length: float, method: str, k: int,
                                depths: Mapping[str, int] | None = None) -> float:
    """The `a` behind a measured accept length of `method` at k (its depth, not k)."""
    return invert_accept_length(mean_accept_length, draft_depth(method, k, depths))


def observed_depth(method: str, k: int, mean_accept_length: float) -> int:
    """The depth a measured mean accept length proves at least (a mean above depth + 1
    is impossible), capped by k: raises a tree's depth where the table is too low."""
    return min(k, max(math.ceil(mean_accept_length - 1.0 - 1e-9), 0))


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
