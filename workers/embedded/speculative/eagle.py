"""EAGLE drafting (Li et al. 2024, arXiv 2401.15077): a chain from a feature-level draft head.

The head reads pairs (f_t, e(x_{t+1})) — the target's final-normed feature at position t
and the embedding of the token after it — and predicts f_{t+1}; the target's own LM head
turns a predicted feature into draft logits. Drafting is autoregressive at the feature
level: the predicted feature and the drafted token form the next input pair.

The head keeps its own one-layer KV cache in step with the committed prefix: entry t is
the pair at position t, computed from the target's *true* features. `EagleSync.sync` rolls
back whatever the last draft appended and feeds the pairs the last verify made known
(hidden[j] with tokens[hidden_start + j + 1]); its last output predicts the feature at the
root's position, whose logits give the first draft token. One step therefore costs one
head forward per draft depth, never a pass over the prefix. A head trained with a draft
vocabulary projects through its own (N, C) rows instead of the target's LM head; q is then
zero outside those N tokens, which the rejection rule handles exactly.

Legend: R the root's position, C hidden size, V vocabulary, f target features,
h predicted features, p target probabilities, q draft probabilities.
"""

from __future__ import annotations

import torch

from workers.embedded.drafter_models import EagleHead, draft_logits
from workers.embedded.model import KVCache, LlamaForCausalLM
from workers.embedded.speculative.chain import draft_chain
from workers.embedded.speculative.draft import DecodeState, Draft


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

    def sync(self, state: DecodeState) -> torch.Tensor:
        """Bring the head cache to the committed prefix [0, R); return h_R (C,), the
        predicted feature at the root's position (its logits give the first draft token)."""
        start, m = state.hidden_start, state.hidden.shape[0]
        self.cache.rollback(min(start, self.cache.length))
        if self.cache.length < start:
            raise RuntimeError("EAGLE head cache fell behind the committed prefix")
        nxt = torch.tensor(state.tokens[start + 1 : start + m + 1], device=self._device)  # (m,)
        features = state.hidden.to(self.head.fc.weight.dtype)[None]  # (1, m, C)
        h = self.head(features, self._embed(nxt)[None], self.cache)  # (1, m, C)
        self.cache.commit()
        return h[0, -1]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Draft logits (..., V) of predicted features h (..., C), float32; -inf outside the
        head's draft vocabulary when it has one."""
        return draft_logits(h, self.head.vocabulary, self.model.lm_head)

    def room(self) -> int:
        """Positions left in the head cache and its RoPE table after the committed prefix."""
        return self.cache.max_length - self.cache.length

    def step(
        self,
        h: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run pairs (h (T, C), e(tokens (T,))) at `positions`; commit them to the cache.

        mask: (T, L + T) bool over everything in the cache plus the new entries (a draft
        tree's visibility); None = a single chain token that sees the whole cache.
        """
        out = self.head(h[None], self._embed(tokens)[None], self.cache, positions, mask)
        self.cache.commit()
        return out[0]  # (T, C)


class EagleChainDrafter:
    """EAGLE-1 style chain of k draft tokens.

    Greedy: argmax at every step, q = None (point masses). Sampling: x ~ q, where q is the
    head's distribution after the request's own temperature / top-k / top-p, and the
    chain carries q so verification applies min(1, p/q).
    """

    def __init__(self, model: LlamaForCausalLM, head: EagleHead) -> None:
        self._eagle = EagleSync(model, head)

    def propose(self, state: DecodeState) -> Draft:
        eagle = self._eagle
        if not eagle.fits(state):
            return Draft.empty()
        h = eagle.sync(state)  # (C,)
        root_position = len(state.tokens) - 1
        steps = min(state.k, eagle.room())
        positions = torch.arange(root_position, root_position + steps, device=h.device)

        def advance(depth: int, token: torch.Tensor) -> torch.Tensor:
            nonlocal h
            h = eagle.step(h[None], token, positions[depth : depth + 1])[0]
            return eagle.logits(h)  # (V,)

        return draft_chain(eagle.logits(h), steps, state.sampler, advance, state.constraint)
