"""EAGLE drafting (Li et al. 2024, arXiv 2401.15077): a chain from a feature-level draft head.

The head reads pairs (f_t, e(x_{t+1})) — the target's final-normed feature at position t
and the embedding of the token after it — and predicts f_{t+1}; the target's own LM head
turns a predicted feature into draft logits. Drafting is autoregressive at the feature
level: the predicted feature and the drafted token form the next input pair.

The head keeps its own one-layer KV cache in step with the committed prefix: entry t is
the pair at position t, computed from the target's *true* features. `EagleSync.sync_input`
rolls back whatever the last draft appended and gives the pairs the last verify made
known (hidden[j] with tokens[hidden_start + j + 1]); the head's last output over them
predicts the feature at the root's position, whose logits give the first draft token.
One step therefore costs one head forward per draft depth, never a pass over the prefix. A head trained with a draft
vocabulary projects through its own (N, C) rows instead of the target's LM head; q is then
zero outside those N tokens, which the rejection rule handles exactly.

Batched drafting: a chain drafter (and EAGLE-2's tree, `speculative.eagle2`) also offers
`propose_steps`, a generator that yields each head forward it needs (`HeadCall`) and is
sent the answer; `speculative.lockstep.draft_together` runs the drafters of all the
sequences in an engine step in lock-step, so each depth is ONE head forward over every
sequence (a ragged batch, `EagleHead.forward_batch`) and one draft projection, not one of
each per sequence. Alone, a drafter is the same generator answered one call at a time
(`propose`).

Legend: R the root's position, C hidden size, V vocabulary, f target features,
h predicted features, p target probabilities, q draft probabilities.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workers.embedded.drafter_models import EagleHead, HeadInput, draft_logits
from workers.embedded.model import KVCache, LlamaForCausalLM
from workers.embedded.speculative.chain import chain_steps
from workers.embedded.speculative.draft import DecodeState, Draft
from workers.embedded.speculative.lockstep import DraftSteps, draft_alone


class EagleSync:
    """The head, its KV cache, and the target's embeddings and LM head it drafts through."""

    def __init__(self, model: LlamaForCausalLM, head: EagleHead) -> None:
        self.model = model
        self.head = head
        self.cache: KVCache = head.new_cache(
            min(model.config.max_position_embeddings, head.config.max_position_embeddings)
        )
        self._embed = model.model.embed_tokens
        self._device = model.lm_head.weight.device

    def fits(self, state: DecodeState) -> bool:
        """Whether the head's cache and RoPE table can hold the committed prefix."""
        return len(state.tokens) <= self.cache.max_length

    def sync_input(self, state: DecodeState) -> HeadInput:
        """Roll the head cache back to what the last verify kept; the pairs it made known
        (hidden[j] with tokens[hidden_start + j + 1]), to run after it."""
        start, m = state.hidden_start, state.hidden.shape[0]
        self.cache.rollback(min(start, self.cache.length))
        if self.cache.length < start:
            raise RuntimeError("EAGLE head cache fell behind the committed prefix")
        nxt = torch.tensor(state.tokens[start + 1 : start + m + 1], device=self._device)  # (m,)
        return HeadInput(state.hidden.to(self.head.fc.weight.dtype), self._embed(nxt),
                         self.cache)

    def chain_input(self, h: torch.Tensor, token: torch.Tensor,
                    position: torch.Tensor) -> HeadInput:
        """The pair (h (1, C), e(token (1,))) at `position` (1,): a chain's next step."""
        return HeadInput(h, self._embed(token), self.cache, position)

    def tree_input(self, h: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor) -> HeadInput:
        """Pairs (h (F, C), e(tokens (F,))) at `positions` seeing what `mask` (F, L + F)
        lets them: a draft tree's frontier."""
        return HeadInput(h, self._embed(tokens), self.cache, positions, mask)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits (..., V) of predicted features h (..., C), float32; -inf outside the
        head's draft vocabulary when it has one."""
        return draft_logits(h, self.head.vocabulary, self.model.lm_head)

    def room(self) -> int:
        """Positions left in the head cache and its RoPE table after the committed prefix."""
        return self.cache.max_length - self.cache.length


class EagleChainDrafter:
    """EAGLE-1 style chain of up to k draft tokens.

    Greedy: argmax at every step, q = None (point masses). Sampling: x ~ q, where q is the
    head's distribution after the request's own temperature / top-k / top-p, and the
    chain carries q so verification applies min(1, p/q). The chain ends early where the
    head is unsure (`min_confidence`, by default the head's measured
    `EagleConfig.chain_confidence`; 0: always k tokens).
    """

    def __init__(self, model: LlamaForCausalLM, head: EagleHead,
                 min_confidence: float | None = None) -> None:
        self._eagle = EagleSync(model, head)
        self._min_confidence = (head.config.chain_confidence if min_confidence is None
                                else min_confidence)

    def propose(self, state: DecodeState) -> Draft:
        """The chain alone."""
        return draft_alone(self.propose_steps(state))

    def propose_steps(self, state: DecodeState) -> DraftSteps:
        """The chain as a generator of its head forwards (see the module docstring)."""
        eagle = self._eagle
        if not eagle.fits(state):
            return Draft.empty()
        h, logits = yield HeadCall(eagle, eagle.sync_input(state))  # (m, C), (1, V)
        h = h[-1:]  # (1, C): h_R
        root_position = len(state.tokens) - 1
        steps = min(state.k, eagle.room())
        positions = torch.arange(root_position, root_position + steps, device=h.device)
        chain = chain_steps(logits[0], steps, state.sampler, state.constraint,
                            self._min_confidence)
        depth = 0
        try:
            token = next(chain)
            while True:
                h, logits = yield HeadCall(eagle, eagle.chain_input(
                    h, token, positions[depth : depth + 1]))
                depth += 1
                token = chain.send(logits[0])
        except StopIteration as done:
            return done.value


@dataclass
class HeadCall:
    """A head forward a drafter waits for; answered with the head's output (T, C) and the
    draft logits of its last row (1, V), or of every row with `all_rows` (T, V: a draft
    tree's frontier), the new entries committed to the cache."""

    sync: EagleSync
    input: HeadInput
    all_rows: bool = False

    @property
    def group(self) -> int:
        return id(self.sync.head)

    @staticmethod
    def answer_all(calls: Sequence[HeadCall]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return answer(calls)


def answer(calls: Sequence[HeadCall]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Calls on one head as one batched forward and one draft projection of the rows
    they want; commits each call's cache."""
    eagle = calls[0].sync
    out = eagle.head.forward_batch([call.input for call in calls])  # (N, C)
    spans, start = [], 0  # per call: its rows in out, its rows of the logits
    wanted: list[int] = []
    for call in calls:
        end = start + call.input.features.shape[0]
        first = len(wanted)
        wanted.extend(range(start, end) if call.all_rows else (end - 1,))
        spans.append((start, end, first, len(wanted)))
        start = end
    logits = eagle.logits(out[torch.tensor(wanted, device=out.device)])  # (rows wanted, V)
    for call in calls:
        call.input.cache.commit()
    return [(out[a:b], logits[c:d]) for a, b, c, d in spans]
