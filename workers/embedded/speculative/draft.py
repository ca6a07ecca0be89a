"""What a drafter hands to verification: a token tree, and the protocol that produces it.

A draft is a tree hanging off the *root*: the last committed token, whose KV entry is not
in the target cache yet (its logits give the distribution of the first draft position).
A chain is the tree whose node i has parent i - 1. Lookahead decoding (arXiv 2402.02057)
also rides an *auxiliary branch* in the same target forward: tokens that see the committed
prefix and the root but no tree node, whose logits go back to the drafter and whose KV
entries are dropped.

Legend: n draft nodes, A auxiliary tokens, V vocabulary, C hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from workers.embedded.speculative.result import VerifyResult
from workers.embedded.speculative.sampling import Sampler

ROOT = -1  # parent index of the root's children


@dataclass
class AuxBranch:
    """Extra tokens verified in the same forward, invisible to (and blind to) the tree."""

    tokens: list[int]
    offsets: list[int]  # position of each token minus the root's position (>= 1)
    mask: torch.Tensor  # (A, A) bool, True where aux token i may attend to aux token j


@dataclass
class Draft:
    """A token tree in topological order: parents[i] < i, or ROOT.

    q: (n, V) distribution node i was drawn from, conditional on its earlier siblings
    having been drawn (i.i.d. sampling: the same q for every sibling; sampling without
    replacement: q with earlier siblings removed). None = every node is a point mass
    (deterministic drafters: n-gram, lookahead, greedy heads). source: which drafter
    proposed it where a method has several (`hybrid`: "ngram" or "eagle"); the engine
    tallies acceptance per source (`GenerationStats.by_source`).
    """

    tokens: list[int]
    parents: list[int]
    q: torch.Tensor | None = None
    aux: AuxBranch | None = None
    source: str | None = None
    depths: list[int] = field(init=False)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("tokens and parents differ in length")
        if self.q is not None and self.q.shape[0] != len(self.tokens):
            raise ValueError("q needs one row per draft node")
        depths: list[int] = []
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"node {i} has parent {parent}; parents must come first")
            depths.append(1 if parent == ROOT else depths[parent] + 1)
        self.depths = depths

    @classmethod
    def chain(cls, tokens: list[int], q: torch.Tensor | None = None) -> Draft:
        return cls(list(tokens), list(range(-1, len(tokens) - 1)), q)

    @classmethod
    def empty(cls) -> Draft:
        return cls([], [])

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self) -> list[list[int]]:
        """children()[0] lists the root's children; children()[1 + i] those of node i."""
        out: list[list[int]] = [[] for _ in range(len(self.tokens) + 1)]
        for i, parent in enumerate(self.parents):
            out[parent + 1].append(i)
        return out

    def prune(self, max_nodes: int, max_depth: int) -> Draft:
        """Keep nodes i < max_nodes with depth <= max_depth (a set closed under ancestors)."""
        keep = [i for i in range(min(max_nodes, len(self.tokens))) if self.depths[i] <= max_depth]
        return self.subset(keep)

    def subset(self, keep: list[int]) -> Draft:
        """The nodes `keep` (ascending, closed under ancestors), renumbered."""
        if len(keep) == len(self.tokens):
            return self
        index = {old: new for new, old in enumerate(keep)}
        parents = [ROOT if self.parents[i] == ROOT else index[self.parents[i]] for i in keep]
        q = self.q[keep] if self.q is not None else None
        return Draft([self.tokens[i] for i in keep], parents, q, self.aux, self.source)


def attention_layout(
    draft: Draft, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor | None, list[int]]:
    """Mask over the forward's new tokens [root, nodes..., aux...] and their position offsets.

    Row r may attend to column c when c is r itself or one of its ancestors; the root is an
    ancestor of everything; aux rows follow `aux.mask`. Returns (None, offsets) for a plain
    chain, where the model's causal mask is the same thing and cheaper.
    """
    n = len(draft)
    offsets = [0, *draft.depths]
    if draft.aux is None and draft.is_chain:
        return None, offsets
    a = len(draft.aux.tokens) if draft.aux is not None else 0
    mask = torch.zeros(1 + n + a, 1 + n + a, dtype=torch.bool)
    mask[:, 0] = True
    for i, parent in enumerate(draft.parents):
        mask[1 + i] = mask[1 + parent]  # ancestors of the parent (the root's row is [True, 0...])
        mask[1 + i, 1 + i] = True
    if draft.aux is not None:
        mask[1 + n :, 1 + n :] = draft.aux.mask
        offsets.extend(draft.aux.offsets)
    return mask.to(device), offsets


class DraftConstraint(Protocol):
    """A grammar an autoregressive drafter drafts under (`chain.draft_chain`), so that its
    drafts are ones the masked target can accept."""

    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        """Drafter logits (V,) at the next draft position, forbidden tokens at -inf."""
        ...

    def push(self, token: int) -> bool:
        """`token` was drafted; False when the grammar has nothing more to say."""
        ...

    def undo(self) -> None:
        """Forget every pushed token (the committed state is what verification sees)."""
        ...


@dataclass
class DecodeState:
    """What a drafter may read before proposing; the engine owns and updates it.

    tokens: committed prompt + generated tokens; tokens[-1] is the root.
    hidden: (m, C) target features (final normed hidden) at positions
    [hidden_start, hidden_start + m): after prefill the whole prompt, after a verify the
    root and the accepted nodes. The feature at position t predicts token t + 1.
    """

    tokens: list[int]
    prompt_len: int
    k: int  # draft-token budget for this request
    sampler: Sampler  # the request's target processing and torch.Generator
    hidden: torch.Tensor
    hidden_start: int
    last: VerifyResult | None = None  # the previous verify step (None right after prefill)
    constraint: DraftConstraint | None = None  # the request's grammar, if any
    max_new_tokens: int | None = None  # the request's output budget (None: no limit)

    @property
    def tokens_left(self) -> int | None:
        """Tokens the request may still generate after the root (None: no limit)."""
        if self.max_new_tokens is None:
            return None
        return self.max_new_tokens - (len(self.tokens) - self.prompt_len)


class Drafter(Protocol):
    """One per generation (it may keep state across steps, e.g. its own KV cache). A
    drafter that can draft in lock-step with the others of an engine step also has
    `propose_steps(state)`, a generator of its network calls (`speculative.lockstep`:
    EAGLE, EAGLE-2, Medusa); the engine then drives it instead of `propose`."""

    def propose(self, state: DecodeState) -> Draft: ...
