"""Lookahead decoding (Fu et al. 2024, arXiv 2402.02057), simplified to one Jacobi level.

Each step runs ONE target forward over [root, verification tree, lookahead window]:
- lookahead branch: a window of W guess tokens at positions root+1 .. root+W, causal among
  themselves, blind to the tree. The target's argmax at each window slot is one Jacobi
  update; it becomes the next step's window (the window slides by one position per step,
  as in the paper).
- n-gram pool: the same window column across the last N-1 levels plus the new output is a
  chain of Jacobi predictions, i.e. an N-gram; it is stored under its first token.
- verification branch: the pool's (N-1)-grams keyed by the root are merged into a trie
  (at most k nodes) and verified by the shared `verify()`.

Simplifications against the paper: the paper feeds all N-1 past levels into the forward
(a 2D window whose mask follows the diagonals); here only the newest level is fed and
older levels are remembered, so each Jacobi update sees the newest guesses of earlier
columns instead of the diagonal. The window is initialised from the prompt's last tokens
(the paper draws random tokens), and the pool is also seeded with the prompt's and the
output's own N-grams (an option of the reference implementation). Draft tokens are
deterministic (point-mass q), so sampling stays lossless through the shared rule.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from workers.embedded.speculative.draft import ROOT, AuxBranch, DecodeState, Draft


@dataclass(frozen=True)
class LookaheadConfig:
    window: int = 6  # W: Jacobi window width
    ngram: int = 4  # N: n-gram size, candidates are N-1 tokens
    pool_per_key: int = 8  # G: candidates kept per first token, most recent first


class LookaheadDrafter:
    def __init__(self, config: LookaheadConfig | None = None) -> None:
        self.config = config or LookaheadConfig()
        w = self.config.window
        self._pool: dict[int, list[tuple[int, ...]]] = {}
        self._levels: deque[list[int]] = deque(maxlen=self.config.ngram - 1)
        self._window: list[int] = []
        self._seen = 0  # committed tokens already mined for n-grams
        self._aux_mask = torch.ones(w, w, dtype=torch.bool).tril()  # (W, W)
        self._offsets = list(range(1, w + 1))

    def propose(self, state: DecodeState) -> Draft:
        if not self._window:
            tokens = state.tokens
            self._window = [tokens[-1 - (i % len(tokens))] for i in range(self.config.window)][::-1]
        elif state.last is not None and state.last.aux_logits is not None:
            self._jacobi_update(state.last.aux_logits.argmax(-1).tolist())
        self._mine(state.tokens)
        draft = self._candidate_tree(state.tokens[-1], state.k)
        draft.aux = AuxBranch(list(self._window), self._offsets, self._aux_mask)
        return draft

    def _jacobi_update(self, outputs: list[int]) -> None:
        """Record the N-grams that end in this step's outputs, then slide the window."""
        self._levels.append(self._window)
        levels = list(self._levels)
        if len(levels) == self.config.ngram - 1:
            for col, out in enumerate(outputs):
                gram = tuple(level[col] for level in levels) + (out,)
                self._add(gram[0], gram[1:])
        self._window = outputs

    def _mine(self, tokens: list[int]) -> None:
        """Add the N-grams of committed text that are complete and not yet seen."""
        n = self.config.ngram
        for i in range(max(self._seen - n + 1, 0), len(tokens) - n + 1):
            self._add(tokens[i], tuple(tokens[i + 1 : i + n]))
        self._seen = len(tokens)

    def _add(self, key: int, gram: tuple[int, ...]) -> None:
        entries = self._pool.setdefault(key, [])
        if gram in entries:
            entries.remove(gram)
        entries.insert(0, gram)
        del entries[self.config.pool_per_key :]

    def _candidate_tree(self, root: int, budget: int) -> Draft:
        """Merge the root's candidates into a trie, most recent first, up to `budget` nodes."""
        tokens: list[int] = []
        parents: list[int] = []
        child_of: dict[tuple[int, int], int] = {}
        for gram in self._pool.get(root, []):
            node = ROOT
            for token in gram:
                nxt = child_of.get((node, token))
                if nxt is None:
                    if len(tokens) == budget:
                        return Draft(tokens, parents)
                    nxt = len(tokens)
                    tokens.append(token)
                    parents.append(node)
                    child_of[(node, token)] = nxt
                node = nxt
        return Draft(tokens, parents)
