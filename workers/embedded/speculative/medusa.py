"""Medusa drafting (Cai et al. 2024, arXiv 2401.10774): extra heads on the target's last feature.

At propose time hidden[-1] is f_{R-1}, the feature of the last committed position, whose
own logits predicted the root x_R. Medusa head i (trained to predict x_{t+2+i} from f_t)
therefore predicts the token at draft depth i + 1: head 0 the root's child, head 1 the
grandchild, and so on. The heads see no draft token, so a node's distribution depends only
on its depth, and a path's draft probability is the product of its tokens' head
probabilities.

The draft is Medusa's sparse candidate tree built per step: the k paths of highest
probability (each node's path probability <= its parent's, so they form a subtree),
found best-first with a heap; heads with a draft vocabulary rank only its N tokens. The tree is deterministic for greedy and sampled requests
alike, so every node is a point mass (q = None): verification's recursive rejection over
siblings is exact at any temperature (Medusa's "typical acceptance" is not, and is not used).

The sequences of an engine step draft in lock-step (`speculative.lockstep`): one
`MedusaCall` each, answered by ONE forward of the heads and one draft projection over
all of their features.

Legend: R the root's position, H heads, N sequences, C hidden size, V vocabulary.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from workers.embedded.drafter_models import MedusaHeads, draft_logits
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.draft import ROOT, DecodeState, Draft
from workers.embedded.speculative.lockstep import DraftSteps, draft_alone


@dataclass
class MedusaCall:
    """The heads' log-probs (depth, V) for one sequence's last feature (1, C)."""

    heads: MedusaHeads
    lm_head: nn.Module
    feature: torch.Tensor
    depth: int

    @property
    def group(self) -> int:
        return id(self.heads)

    @staticmethod
    def answer_all(calls: Sequence[MedusaCall]) -> list[torch.Tensor]:
        first = calls[0]
        depth = max(call.depth for call in calls)
        features = torch.cat([call.feature for call in calls])[:, None]  # (N, 1, C)
        per_head = first.heads(features)[:depth, :, 0]  # (depth, N, C)
        logits = draft_logits(per_head, first.heads.vocabulary, first.lm_head)  # (depth, N, V)
        logp = logits.log_softmax(-1)  # -inf outside a draft vocabulary
        return [logp[: call.depth, n] for n, call in enumerate(calls)]


class MedusaDrafter:
    def __init__(self, model: LlamaForCausalLM, heads: MedusaHeads) -> None:
        self._lm_head = model.lm_head
        self._heads = heads
        self._dtype = next(heads.parameters()).dtype

    def propose(self, state: DecodeState) -> Draft:
        """This sequence's tree alone."""
        return draft_alone(self.propose_steps(state))

    def propose_steps(self, state: DecodeState) -> DraftSteps:
        """The tree as a generator of its one heads call (`speculative.lockstep`)."""
        k = state.k
        depth = min(self._heads.config.num_heads, k)
        if depth == 0:
            return Draft.empty()
        feature = state.hidden[-1:].to(self._dtype)  # (1, C)
        logp = yield MedusaCall(self._heads, self._lm_head, feature, depth)  # (depth, V)
        top = logp.topk(min(k, logp.shape[-1]), dim=-1)  # (depth, k) best first per head
        return best_paths(top.values.tolist(), top.indices.tolist(), k)


def best_paths(logp: list[list[float]], tokens: list[list[int]], k: int) -> Draft:
    """The k most probable nodes of the tree whose depth-d children are tokens[d - 1],
    each scored by the sum of its path's log-probs logp[d - 1][rank].

    Best-first: popping a node pushes its next sibling and its first child, the only
    candidates that can come next, because ranks are sorted within each depth.
    """
    depth = len(logp)
    out_tokens: list[int] = []
    parents: list[int] = []
    if depth == 0 or k == 0:
        return Draft(out_tokens, parents)
    # entries: (-score, creation order, depth index, rank, parent node, parent score)
    heap = [(-logp[0][0], 0, 0, 0, ROOT, 0.0)]
    counter = 1
    while heap and len(out_tokens) < k:
        neg, _, d, rank, parent, parent_score = heapq.heappop(heap)
        node = len(out_tokens)
        out_tokens.append(tokens[d][rank])
        parents.append(parent)
        if rank + 1 < len(logp[d]):
            score = parent_score + logp[d][rank + 1]
            heapq.heappush(heap, (-score, counter, d, rank + 1, parent, parent_score))
            counter += 1
        if d + 1 < depth:
            score = -neg + logp[d + 1][0]
            heapq.heappush(heap, (-score, counter, d + 1, 0, node, -neg))
            counter += 1
    return Draft(out_tokens, parents)
