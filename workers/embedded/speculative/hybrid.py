"""Hybrid drafting: copy from the context where it matches, EAGLE where it does not.

Per verify step: when the last n tokens (n >= `min_match`) occurred earlier in the prompt or
the text generated so far, the draft is prompt lookup's continuation of that occurrence
(`speculative.ngram`; SAM-Decoding, arXiv 2411.10666, pairs a suffix match with EAGLE-2 the
same way); else it is the EAGLE chain with its confidence cutoff (`speculative.eagle`).
Answers switch between copying and writing inside one request (an edit copies the
untouched lines and writes the changed ones), which one drafter per request cannot
follow. A short match is weak evidence (two common tokens in a row); a rejected copy
wastes a step that EAGLE would have used. The threshold (`min_match`) keeps the cost down:
a match of 2 was chosen on the training prompts (bench/traces/data/prompts.jsonl,
`bench/engine/hybrid_variants.py`; docs/results/2026-12-07-hybrid.md). Backing off after a
miss (`miss_backoff`: the next steps do not copy whatever matches) was the rule until
2026-12-07. Timed side by side on the training prompts (two runs), no back-off was faster
on long-input summaries and extraction (+3%, +7%: a missed copy is followed by copies
that pay), edits (+7%, +3%) and code (+14%, +14%), within 2% on chat and structured
output (docs/results/2026-12-07-hybrid-4.md).

An EAGLE draft is not free: on this CPU each drafted token adds about a quarter of a plain
step (head forward, projection, one more verified position; measured.json's batch-1
costs), so where EAGLE's chains are mostly rejected (long-input prose: summaries, RAG) a
plain step is cheaper. Where nothing is copied, EAGLE drafts only while this request's EAGLE
steps have accepted at least `eagle_min_rate` of the tokens they cost; below it the step
is plain (an empty draft, branch `plain`), or, with `fallback_k`, a short copy from a
shorter match; every `eagle_probe` plain steps (doubling while it stays below) one EAGLE
step measures again. `short_k` caps a copy whose match is only `min_match` long.
Nor is the head's first step: it reads every position it has not read, the whole prompt
at a request's first EAGLE step (~0.005 of a plain step a position here: ~3 plain steps
for a 600-token article; docs/results/2026-12-07-hybrid-3.md). So EAGLE's accepted tokens
must also cover that sync (`sync_cost`), and a probe waits that many times longer: a
long input that is being copied is not read by the head for a chance at EAGLE. Nor where
the request has too little left to generate for EAGLE to pay the sync back: a step whose
sync costs more than `eagle_gain` (0.1) of a plain step for each token left stays plain
(`DecodeState.tokens_left`, from the request's `max_new_tokens`). Chosen on the long
training summaries and extractions (two runs, faster in both: +5.4%, +1.9%; 0.2 drafted
as without it); on the other classes' prompts it drafts the very same tokens
(docs/results/2026-12-07-hybrid-5.md).

Two options stay off by default (`copy_k`, `eagle_k`): a copy kept short unless the last
copy was accepted whole, and a cap on EAGLE's chain. A verify step's cost grows in steps
with its draft (the 4-bit kernel's blocks of four rows: `bench.engine.verify_cost`), so
both looked worth a try; on the training prompts neither rule paid where it was meant to
(docs/results/2026-12-07-hybrid-6.md), nor did a lower `eagle_min_rate` (0.1: faster on
edits and code, 8% slower on summaries).

Lossless like every method: the shared `verify()` accepts either draft (the n-gram chain
is a point mass, q = None; EAGLE's carries its q). The branch is chosen from the
committed tokens and the previous step's verify result alone, both known before this
step draws anything (the EAGLE evidence included). Each draft names its branch
(`Draft.source`: ngram, eagle, plain), so the request's stats count steps and accepted
tokens per branch.

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

from workers.embedded.api import PLAIN_BRANCH
from workers.embedded.drafter_models import EagleHead
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.draft import DecodeState, Draft
from workers.embedded.speculative.eagle import EagleChainDrafter
from workers.embedded.speculative.lockstep import DraftSteps, draft_alone
from workers.embedded.speculative.ngram import NgramDrafter, lookup

NGRAM, EAGLE = "ngram", "eagle"  # the drafting branches (`Draft.source`)


@dataclass(frozen=True)
class HybridConfig:
    min_match: int = 2  # shortest suffix match that drafts by n-gram
    max_ngram: int = 4  # longest suffix looked up first
    min_confidence: float | None = None  # EAGLE chain cutoff; None: the head's measured one
    # after an n-gram draft of which nothing was accepted, the next `miss_backoff` steps
    # may not copy (0: never back off)
    miss_backoff: int = 0
    # a match of exactly `min_match` tokens (weak support) drafts at most this many (0: k)
    short_k: int = 2
    # where nothing is copied, EAGLE drafts only while this request's EAGLE steps accepted
    # at least this share of the tokens they cost (drafted tokens, or 1 for a chain cut at
    # its first token): what a drafted token costs over a plain step (0: always EAGLE)
    eagle_min_rate: float = 0.25
    # plain steps in a row after which one EAGLE step measures again; doubled after each
    # such step that leaves the rate below the bar
    eagle_probe: int = 4
    # where EAGLE does not pay, a match shorter than `min_match` (down to 1 token) drafts
    # at most this many tokens rather than none (0: a plain step)
    fallback_k: int = 2
    # what bringing the EAGLE head's cache up to date costs, in plain steps per position
    # it has not read (the prompt, at a request's first EAGLE step; the steps drafted
    # without EAGLE since its last one): EAGLE's accepted tokens must cover it too, and a
    # probe waits that many times longer (0: free, the rule before it)
    sync_cost: float = 0.005
    # the most of a plain step EAGLE can save a token the request has left to generate:
    # an EAGLE step whose sync costs more than that over the tokens left cannot pay it
    # back, and the step goes plain (0: no such check)
    eagle_gain: float = 0.1
    # a copy drafts at most this many tokens unless the last step's copy was accepted
    # whole, when it may draft up to k (0: k always); EAGLE's chain drafts at most
    # `eagle_k` (0: k). A verify step's cost is not linear in its draft: the 4-bit kernel
    # multiplies four rows at a time, so a fifth position starts a second pass over the
    # weights (the curve: docs/WORKER.md, "The decode step")
    copy_k: int = 0
    eagle_k: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_ngram:
            raise ValueError("hybrid needs 1 <= min_match <= max_ngram")
        if min(self.miss_backoff, self.short_k, self.fallback_k, self.copy_k, self.eagle_k) < 0:
            raise ValueError("hybrid needs miss_backoff, short_k, fallback_k, copy_k, eagle_k >= 0")
        if not 0.0 <= self.eagle_min_rate <= 1.0 or self.eagle_probe < 1:
            raise ValueError("hybrid needs 0 <= eagle_min_rate <= 1 and eagle_probe >= 1")
        if self.sync_cost < 0 or not 0.0 <= self.eagle_gain <= 1.0:
            raise ValueError("hybrid needs sync_cost >= 0 and 0 <= eagle_gain <= 1")


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
        self._whole = False  # the last step was a copy accepted whole
        # this request's EAGLE evidence: tokens accepted, tokens paid for (a prior of one
        # accepted in two, so that a request starts by trying EAGLE); plain steps since the
        # last EAGLE step, and how many of them call for the next one
        self._eagle = [1, 2]
        self._plain_run = 0
        self._probe = self.config.eagle_probe

    def propose(self, state: DecodeState) -> Draft:
        """The draft alone."""
        return draft_alone(self.propose_steps(state))

    def propose_steps(self, state: DecodeState) -> DraftSteps:
        """n-gram's draft at once, a plain step (empty draft), or EAGLE's chain as a
        generator of its head forwards, so that EAGLE branches of several sequences draft
        in lock-step."""
        # proposing again for the same state (or an earlier one) replaces its features
        self._unread = [(s, h) for s, h in self._unread if s < state.hidden_start]
        self._unread.append((state.hidden_start, state.hidden))
        copy = self._read_last(state)
        copied = self._copy(state) if copy else []
        if copied:
            return self._named(Draft.chain(copied), NGRAM)
        if not self._eagle_pays(sum(h.shape[0] for _, h in self._unread), state.tokens_left):
            self._plain_run += 1
            fallback = self._fallback(state) if copy else []
            if fallback:
                return self._named(Draft.chain(fallback), NGRAM)
            return self._named(Draft.empty(), PLAIN_BRANCH)
        self._plain_run = 0
        start = self._unread[0][0]
        hidden = torch.cat([h for _, h in self._unread])  # (sum m_i, C)
        if start + hidden.shape[0] != state.hidden_start + state.hidden.shape[0]:
            raise RuntimeError("hybrid: the features kept for the EAGLE head have a gap")
        self._unread = []
        self._branch = EAGLE
        k = min(state.k, self.config.eagle_k or state.k)
        draft = yield from self._chain.propose_steps(
            dataclasses.replace(state, hidden=hidden, hidden_start=start, k=k))
        draft.source = EAGLE
        return draft

    def _named(self, draft: Draft, branch: str) -> Draft:
        self._branch = draft.source = branch
        return draft

    def _copy(self, state: DecodeState) -> list[int]:
        """Prompt lookup's continuation: k tokens after a match longer than `min_match`
        (`copy_k` unless the last copy was accepted whole), `short_k` after a match of
        exactly `min_match` (weak support)."""
        config = self.config
        k = state.k if self._whole or not config.copy_k else min(state.k, config.copy_k)
        history = self._ngram.history(state.tokens)
        if not config.short_k or config.min_match == config.max_ngram:
            return lookup(history, config.max_ngram, config.min_match, k)
        tokens = lookup(history, config.max_ngram, config.min_match + 1, k)
        return tokens or lookup(history, config.min_match, config.min_match,
                                min(k, config.short_k))

    def _fallback(self, state: DecodeState) -> list[int]:
        """A match shorter than `min_match`'s continuation, at most `fallback_k` tokens."""
        if not self.config.fallback_k or self.config.min_match == 1:
            return []
        return lookup(self._ngram.history(state.tokens), self.config.min_match - 1, 1,
                      min(state.k, self.config.fallback_k))

    def _eagle_pays(self, unread: int, left: int | None) -> bool:
        """Whether EAGLE drafts this step: while the tokens its steps accepted cover, in
        plain steps, `eagle_min_rate` of each token they drafted and the sync of the
        `unread` positions it would read now (`sync_cost`); and once after `_probe` plain
        steps in a row (times the sync's cost in plain steps where that is more than 1).
        Never where the sync costs more than EAGLE could save over the `left` tokens
        (`eagle_gain`)."""
        accepted, paid = self._eagle
        sync = self.config.sync_cost * unread
        if self.config.eagle_gain and left is not None and sync > self.config.eagle_gain * left:
            return False
        if accepted >= self.config.eagle_min_rate * paid + sync:
            self._probe = self.config.eagle_probe
            return True
        if self._plain_run >= self._probe * max(1.0, sync):
            self._probe *= 2
            return True
        return False

    def _read_last(self, state: DecodeState) -> bool:
        """Read the previous step's verify result once (a step proposed again keeps the
        count), so the choice depends on committed tokens alone: EAGLE's evidence, and the
        back-off after a copy that missed. Whether this step may copy."""
        if self._counted < state.hidden_start:
            self._counted = state.hidden_start
            last = state.last
            self._whole = (self._branch == NGRAM and last is not None
                           and len(last.accepted) == last.num_proposed > 0)
            if self._branch == NGRAM and last is not None and not last.accepted:
                self._backoff = self.config.miss_backoff
            elif self._backoff > 0:
                self._backoff -= 1
            if self._branch == EAGLE and last is not None:
                self._eagle[0] += len(last.accepted)
                self._eagle[1] += max(last.num_proposed, 1)
        return self._backoff == 0
