"""Hybrid drafting: copy from the context where it matches, EAGLE where it does not.

Per verify step: when the last n tokens (n >= `min_match`) occurred earlier in the prompt or
the text generated so far, the draft is prompt lookup's continuation of that occurrence
(`speculative.ngram`; SAM-Decoding, arXiv 2411.10666, pairs a suffix match with EAGLE-2 the
same way); else it is the EAGLE chain with its confidence cutoff (`speculative.eagle`).
Answers switch between copying and writing inside one request (an edit copies the
untouched lines and writes the changed ones), which one drafter per request cannot
follow. A short match is weak evidence (two common tokens in a row); a rejected copy
wastes a step that EAGLE would have used. Two rules keep the cost down: the threshold
(`min_match`), and backing off after a miss: when nothing of a copied draft was accepted,
the next `miss_backoff` steps draft by EAGLE whatever matches (the context has stopped
repeating; this request's own evidence, unlike a fixed threshold). Both were chosen on the
training prompts (bench/traces/data/prompts.jsonl, `bench/engine/hybrid_variants.py`):
a match of 2 with a back-off of 2 steps accepted the most (docs/results/2026-12-07-hybrid.md).

Lossless like every method: the shared `verify()` accepts either draft (the n-gram chain
is a point mass, q = None; EAGLE's carries its q). The branch is chosen from the
committed tokens and the previous step's verify result alone, both known before this
step draws anything. Each draft names its branch
(`Draft.source`), so the request's stats count steps and accepted tokens per branch.

The EAGLE head's cache must hold the pairs of every committed position before it drafts.
Steps drafted by n-gram leave it behind, so the target features of those steps are kept
and the next EAGLE step feeds them all in its one sync forward (`EagleSync.sync_input`
reads `hidden` from `hidden_start` on): no head forward on an n-gram step.

Legend: m_i committed positions of step i, C hidden size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from workers.embedded.drafter_models import EagleHead
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.draft import DecodeState, Draft
from workers.embedded.speculative.eagle import EagleChainDrafter
from workers.embedded.speculative.lockstep import DraftSteps, draft_alone
from workers.embedded.speculative.ngram import NgramDrafter


@dataclass(frozen=True)
class HybridConfig:
    min_match: int = 2  # shortest suffix match that drafts by n-gram
    max_ngram: int = 4  # longest suffix looked up first
    min_confidence: float | None = None  # EAGLE chain cutoff; None: the head's measured one
    # after an n-gram draft of which nothing was accepted, the next `miss_backoff` steps
    # draft by EAGLE whatever matches (0: never back off)
    miss_backoff: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_ngram:
            raise ValueError("hybrid needs 1 <= min_match <= max_ngram")
        if self.miss_backoff < 0:
            raise ValueError("hybrid needs miss_backoff >= 0")


class HybridDrafter:
    def __init__(self, model: LlamaForCausalLM, head: EagleHead,
                 config: HybridConfig | None = None) -> None:
        self.config = config or HybridConfig()
        self._ngram = NgramDrafter(self.config.max_ngram, self.config.min_match)
        self._chain = EagleChainDrafter(model, head, self.config.min_confidence)
        # (hidden_start, hidden (m_i, C)) of the steps since the head last read features
        self._unread: list[tuple[int, torch.Tensor]] = []
        # the branch of the last draft, the step whose verify result was last read (its
        # hidden_start), and the steps left to back off from copying
        self._branch: str | None = None
        self._counted = -1
        self._backoff = 0

    def propose(self, state: DecodeState) -> Draft:
        """The draft alone."""
        return draft_alone(self.propose_steps(state))

    def propose_steps(self, state: DecodeState) -> DraftSteps:
        """n-gram's draft at once, or EAGLE's chain as a generator of its head forwards,
        so that EAGLE branches of several sequences draft in lock-step."""
        # proposing again for the same state (or an earlier one) replaces its features
        self._unread = [(s, h) for s, h in self._unread if s < state.hidden_start]
        self._unread.append((state.hidden_start, state.hidden))
        copy = self._copy_allowed(state)
        copied = self._ngram.propose(state) if copy else None
        if copied is not None and len(copied) > 0:
            copied.source = "ngram"
            self._branch = "ngram"
            return copied
        self._branch = "eagle"
        start = self._unread[0][0]
        hidden = torch.cat([h for _, h in self._unread])  # (sum m_i, C)
        if start + hidden.shape[0] != state.hidden_start + state.hidden.shape[0]:
            raise RuntimeError("hybrid: the features kept for the EAGLE head have a gap")
        self._unread = []
        draft = yield from self._chain.propose_steps(
            dataclasses.replace(state, hidden=hidden, hidden_start=start))
        draft.source = "eagle"
        return draft

    def _copy_allowed(self, state: DecodeState) -> bool:
        """Whether this step may copy: not while backing off after a copy that missed.
        Counted once per step from the previous verify step (a step proposed again keeps
        the count), so the choice depends on committed tokens alone."""
        if self._counted < state.hidden_start:
            self._counted = state.hidden_start
            if self._branch == "ngram" and state.last is not None and not state.last.accepted:
                self._backoff = self.config.miss_backoff
            elif self._backoff > 0:
                self._backoff -= 1
        return self._backoff == 0
