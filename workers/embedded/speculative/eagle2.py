"""EAGLE-2 dynamic draft trees (Li et al. 2024, arXiv 2406.16858) from the EAGLE head.

Expansion: the root's top-`topk` tokens form depth 1. At every further depth the head
runs once over the frontier (the `topk` best nodes of the previous depth by cumulative
draft log-probability), each frontier node proposes its `topk` best children, and the
`topk` best children overall become the next frontier. A node's input pair is (h of its
parent, e(its token)) at position R + depth - 1, and it attends to the committed prefix,
its ancestors' head-cache entries and itself — a tree mask over the head's own cache.
Reranking: all drafted nodes are ranked by cumulative log-probability and the best `k`
form the draft (a child never outranks its parent, so the set is a subtree). For the same
reason expansion stops early, with the same result, once the k-th best node so far
outranks the whole frontier: an unconfident head costs fewer head forwards.

The tree is deterministic for greedy and for sampled requests, so every node is a point
mass (q = None): verification's recursive rejection over siblings is then exact for any
temperature, and a node's children are accepted with the target's mass on their tokens.

Drafting runs as a generator of head forwards (`propose_steps`), so the engine drafts the
trees of all the sequences of a step in lock-step with each other and with EAGLE chains:
one head forward per depth over every sequence (`speculative.lockstep.draft_together`).

Legend: R the root's position, F frontier size, C hidden size, V vocabulary.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from policies.methods import TREE_DEPTH
from workers.embedded.drafter_models import EagleHead
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.draft import ROOT, DecodeState, Draft
from workers.embedded.speculative.eagle import EagleSync, HeadCall
from workers.embedded.speculative.lockstep import DraftSteps, draft_alone


@dataclass(frozen=True)
class EagleTreeConfig:
    topk: int = 4  # children per expanded node, and frontier width
    depth: int = TREE_DEPTH["eagle2"]  # most draft depths (policies.methods); k caps it too


class EagleTreeDrafter:
    def __init__(
        self, model: LlamaForCausalLM, head: EagleHead, config: EagleTreeConfig | None = None
    ) -> None:
        self.config = config or EagleTreeConfig()
        self._eagle = EagleSync(model, head)
        # cumulative draft log-prob of each node of the last draft
        self.last_scores: list[float] = []

    def propose(self, state: DecodeState) -> Draft:
        """The tree alone."""
        return draft_alone(self.propose_steps(state))

    def propose_steps(self, state: DecodeState) -> DraftSteps:
        """The tree as a generator of its head forwards (`speculative.eagle`): the sync,
        then one call per depth over the frontier, which wants every row's logits."""
        eagle = self._eagle
        if not eagle.fits(state):
            return Draft.empty()
        h, logits = yield HeadCall(eagle, eagle.sync_input(state))  # (m, C), (1, V)
        h_root = h[-1]  # (C,)
        committed = eagle.cache.length  # R
        topk = min(self.config.topk, state.k)
        depth = min(self.config.depth, state.k, 1 + (eagle.room() - 1) // topk)
        device = h_root.device

        top = logits[0].log_softmax(-1).topk(topk)
        tokens: list[int] = top.indices.tolist()
        parents: list[int] = [ROOT] * topk
        scores: list[float] = top.values.tolist()
        frontier = list(range(topk))  # node ids to expand next
        inputs = h_root.expand(topk, -1)  # (F, C) the h each frontier node's pair carries
        entry_of: dict[int, int] = {}  # node id -> its head-cache index after the prefix
        for d in range(1, depth):
            if (
                len(scores) >= state.k
                and heapq.nlargest(state.k, scores)[-1] >= scores[frontier[0]]
            ):
                break  # children score at most their parent: none could enter the best k
            mask = self._mask(frontier, parents, entry_of, committed, eagle.cache.length, device)
            for i, node in enumerate(frontier):
                entry_of[node] = eagle.cache.length - committed + i
            positions = torch.full((len(frontier),), committed + d - 1, device=device)
            frontier_tokens = torch.tensor([tokens[n] for n in frontier], device=device)
            h, logits = yield HeadCall(eagle, eagle.tree_input(
                inputs, frontier_tokens, positions, mask), all_rows=True)  # (F, C), (F, V)
            logp = logits.log_softmax(-1)
            base = torch.tensor([scores[n] for n in frontier], device=device)[:, None]
            child = logp.topk(topk, dim=-1)  # (F, topk) per frontier node
            cumulative = (child.values + base).flatten()  # (F * topk,)
            order = cumulative.argsort(descending=True).tolist()
            child_tokens = child.indices.flatten().tolist()
            cumulative_list = cumulative.tolist()
            first_new = len(tokens)
            for flat in order:  # best first, so node ids follow rank within a depth
                tokens.append(child_tokens[flat])
                parents.append(frontier[flat // topk])
                scores.append(cumulative_list[flat])
            best = order[:topk]
            frontier = [first_new + r for r in range(len(best))]
            inputs = h[torch.tensor([flat // topk for flat in best], device=device)]  # (F, C)
        return self._rerank(tokens, parents, scores, state.k)

    @staticmethod
    def _mask(
        frontier: list[int],
        parents: list[int],
        entry_of: dict[int, int],
        committed: int,
        cache_length: int,
        device: torch.device,
    ) -> torch.Tensor:
        """(F, L + F): the prefix, each node's ancestors' cache entries, and itself."""
        f = len(frontier)
        mask = torch.zeros(f, cache_length + f, dtype=torch.bool)
        mask[:, :committed] = True
        for i, node in enumerate(frontier):
            mask[i, cache_length + i] = True
            parent = parents[node]
            while parent != ROOT:
                mask[i, committed + entry_of[parent]] = True
                parent = parents[parent]
        return mask.to(device)

    def _rerank(self, tokens: list[int], parents: list[int], scores: list[float], k: int) -> Draft:
        """The k best nodes by score (ties: the earlier node, so parents come first), kept
        in creation order, which is topological."""
        ranked = sorted(range(len(tokens)), key=lambda n: (-scores[n], n))[:k]
        keep = sorted(ranked)
        index = {old: new for new, old in enumerate(keep)}
        self.last_scores = [scores[n] for n in keep]
        return Draft(
            [tokens[n] for n in keep],
            [ROOT if parents[n] == ROOT else index[parents[n]] for n in keep],
        )
