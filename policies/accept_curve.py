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

- k' <= k: a run of j + 1 tokens takes ceil((j + 1) / (k' + 1)) steps at k' — the drafts
  a step accepted past a cut stay acceptable when drafted from the cut (the reading of
  SpecDecode-Bench, arXiv 2601.11580, and of the trace world, bench/traces/world.py,
  checked there against a k 16 recording: k 8 derived from it within 0.5% of the k 8
  recording). So accept length(k') = sum h[j] (j + 1) / sum h[j] ceil((j + 1) / (k' + 1)):
  exact at k' = k, the mean of what was measured.
- k' > k: what a step that accepted all k drafts would have gone on to accept was never
  measured (censored). Such steps are taken to go on accepting each further draft with
  the chance the measured top positions had, q = S(k) / S(k - 1) (S(i): the share of
  steps that accepted at least i drafts), which the caller bounds by its trust region
  (k' at most a margin above the k measured). A run cut by the recording's k is then
  also longer than measured, so this under-counts nothing below k.
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
    if k <= k_run:
        needed = sum(h * math.ceil((j + 1) / (k + 1)) for j, h in enumerate(histogram))
        return tokens / needed
    full = sum(histogram[k_run:])  # steps that took every draft (a longer bin: a bigger k)
    below = full + (histogram[k_run - 1] if 0 < k_run <= len(histogram) else 0.0)
    q = full / below if below > 0 else 0.0
    extra = sum(q ** i for i in range(1, k - k_run + 1))
    return (tokens + full * extra) / steps


def curve(histogram: Sequence[float], k_run: int, ks: Sequence[int]) -> dict[int, float]:
    """`accept_length_at` for each k of `ks`."""
    return {k: accept_length_at(histogram, k_run, k) for k in ks}
