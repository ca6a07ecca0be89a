"""Drafters that need no weights: none (plain decoding) and prompt lookup.

Prompt lookup decoding (Saxena 2023; vLLM/SGLang "ngram"): find an earlier occurrence of
the last n tokens (n = 3, then 2, then 1) in prompt + generated history and propose the
k tokens that followed it. Deterministic, so q is a point mass.
"""

from __future__ import annotations

import numpy as np

from workers.embedded.speculative.draft import DecodeState, Draft


class NoDraft:
    """Plain decoding through the same verify path: the tree is just the root."""

    def propose(self, state: DecodeState) -> Draft:
        return Draft.empty()


class NgramDrafter:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._history = np.zeros(0, dtype=np.int64)
        self._length = 0

    def propose(self, state: DecodeState) -> Draft:
        h = self.history(state.tokens)
        return Draft.chain(lookup(h, self.max_ngram, self.min_ngram, state.k))

    def history(self, tokens: list[int]) -> np.ndarray:
        """Mirror the append-only token list into a growing numpy buffer; its view."""
        n = len(tokens)
        if n > self._history.shape[0]:
            grown = np.zeros(max(2 * n, 256), dtype=np.int64)
            grown[: self._length] = self._history[: self._length]
            self._history = grown
        self._history[self._length : n] = tokens[self._length :]
        self._length = n
        return self._history[:n]


def lookup(history: np.ndarray, max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Continuation of the last n-gram's earlier occurrence: the latest one with k tokens
    after it, else the earliest (the longest continuation available)."""
    length = history.shape[0]
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        suffix = history[length - n :]
        span = length - n  # candidate starts [0, span) exclude the suffix itself
        hit = np.ones(span, dtype=bool)
        for j in range(n):
            hit &= history[j : j + span] == suffix[j]
        starts = np.flatnonzero(hit)
        if starts.size == 0:
            continue
        full = starts[starts + n + k <= length]
        begin = int(full[-1] if full.size else starts[0]) + n
        return history[begin : begin + k].tolist()
    return []
