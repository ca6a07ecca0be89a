"""Statistical assertions shared by the lossless-sampling tests."""

from __future__ import annotations

from collections import Counter

import torch
from scipy.stats import chisquare


def assert_follows(counts: Counter[int], p: torch.Tensor) -> None:
    """Chi-square goodness of fit of sampled token counts to `p`; tokens with small
    expected counts pooled."""
    total = sum(counts.values())
    expected = (p.double() / p.double().sum() * total).tolist()
    big = [t for t in range(len(expected)) if expected[t] >= 20]
    observed = [counts[t] for t in big] + [total - sum(counts[t] for t in big)]
    wanted = [expected[t] for t in big] + [total - sum(expected[t] for t in big)]
    if wanted[-1] < 1:
        assert observed.pop() == 0
        wanted.pop()
        wanted[-1] += total - sum(wanted)
    assert chisquare(observed, wanted).pvalue > 1e-3, (observed, wanted)
