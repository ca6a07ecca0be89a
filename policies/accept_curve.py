"""Accept length as a function of k, from the measured steps of a run at one k.

A worker that counts its decode verify steps by the draft tokens each accepted (SGLang's
per-request `spec_correct_drafts_histogram`, sglang `managers/io_struct.py`
`BatchStrOutput`; the embedded worker's, `workers/embedded/responses.py`; vLLM's
engine-wide `vllm:spec_decode_num_accepted_tokens_per_pos`, `vllm/v1/spec_decode/
metrics.py`, is the same counts read as survivals) gives the accept length at every k'
up to the k it ran at without E(a, k) (arXiv 2211.17192), whose independent per-token
`a` misreads a drafter whose acceptance comes in runs (prompt lookup: a step takes none
of its draft or all of it; docs/TRACES.md). Notation: h[j] the steps that accepted j
drafts (j = 0..k), so each yielded j + 1 tokens.

- k' <= k: a step of j + 1 tokens takes ceil((j + 1) / (k' + 1)) steps at k' (the drafts
  it accepted past a cut stay acceptable when drafted from the cut: the reading of
  SpecDecode-Bench, arXiv 2601.11580, and of the trace world, bench/traces/world.py,
  checked there against a k 16 recording). So accept length(k') >= sum h[j] (j + 1) /
  sum h[j] ceil((j + 1) / (k' + 1)): exact at k' = k and where k' + 1 divides k + 1; a
  lower bound elsewhere, because a step that took all k drafts may have been cut from a
  longer run that the next step went on with, and merged runs need fewer steps (n-gram
  at k 2 on the trace world: 1.255 read for k 1 against the world's 1.348).
- k' > k: what a step that took every draft would have gone on to accept was never
  measured: no gain is read above k (the accept length at k). So the histogram never
  predicts a relaunch to gain where the measured steps do not show it: E(a, k) with the
  top positions' rate of an n-gram pool at k 2 predicted 1.88 tokens a step at k 4 where
  the world yields 1.71, and a relaunch that loses 6%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

MIN_STEPS = 20.0  # decode steps behind a histogram before it replaces E(a, k)


def accept_length_at(histogram: Sequence[float], k_run: int, k: int) -> float:
    """Tokens per decode verify step at k from the histogram of a run at `k_run`."""
    steps = sum(histogram)
    if steps <= 0 or k <= 0:
        return 1.0
    tokens = sum(h * (j + 1) for j, h in enumerate(histogram))
    k = min(k, k_run)
    return tokens / sum(h * math.ceil((j + 1) / (k + 1)) for j, h in enumerate(histogram))


def curve(histogram: Sequence[float], k_run: int, ks: Sequence[int]) -> dict[int, float]:
    """`accept_length_at` for each k of `ks`."""
    return {k: accept_length_at(histogram, k_run, k) for k in ks}
