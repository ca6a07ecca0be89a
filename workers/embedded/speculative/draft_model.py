"""Draft-model speculation (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023,
arXiv 2302.01318): a small model with the target's tokenizer drafts a chain of k tokens.

The draft model keeps its own KV cache over the committed tokens. Before each draft the
cache is cut back to the longest prefix that still matches the committed tokens (the draft
tokens the target accepted stay), and the tokens after it, ending with the root, are fed in
one forward; then k - 1 single-token forwards extend the chain.

Greedy: argmax, q = None. Sampling: x ~ q, q = the draft model's distribution after the
request's temperature / top-k / top-p (the same processing as the target's p), carried in
the draft for min(1, p/q).

Legend: R the root's position, V vocabulary, p target probs, q draft probs.
"""

from __future__ import annotations

import torch

from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.chain import draft_chain
from workers.embedded.speculative.draft import DecodeState, Draft


class DraftModelDrafter:
    def __init__(self, draft_model: LlamaForCausalLM, max_length: int) -> None:
        self._model = draft_model
        self._cache = draft_model.new_cache(
            max_length=min(max_length, draft_model.config.max_position_embeddings)
        )
        self._cached: list[int] = []  # the tokens whose entries the cache holds
        self._device = draft_model.lm_head.weight.device

    def sync(self, state: DecodeState) -> torch.Tensor:
        """Make the cache hold tokens[0, R] (root included); return the logits (V,) for the
        first draft position."""
        tokens, cached = state.tokens, self._cached
        valid = min(len(cached), len(tokens) - 1, state.hidden_start)
        # entries before hidden_start are committed; accepted draft tokens may match further
        while valid < min(len(cached), len(tokens) - 1) and cached[valid] == tokens[valid]:
            valid += 1
        self._cache.rollback(valid)
        del cached[valid:]
        new = tokens[valid:]
        out = self._model(torch.tensor([new], device=self._device), self._cache, last_only=True)
        self._cache.commit()
        cached.extend(new)
        return out.logits[0, -1]

    def propose(self, state: DecodeState) -> Draft:
        if len(state.tokens) > self._cache.max_length:  # a draft model with a shorter context
            return Draft.empty()
        logits = self.sync(state)
        steps = min(state.k, self._cache.max_length - self._cache.length + 1)

        def advance(depth: int, token: torch.Tensor) -> torch.Tensor:
            out = self._model(token.view(1, 1), self._cache)
            self._cache.commit()
            return out.logits[0, -1]

        draft = draft_chain(logits, steps, state.sampler, advance, state.constraint)
        self._cached.extend(draft.tokens[: steps - 1])  # fed to the cache by `advance`
        return draft
