"""One target forward over [root, draft tree, aux branch], then acceptance: shared by all drafters.

Greedy (temperature 0): walk the tree from the root, at each node descend into the child
whose token is the target's argmax; the bonus token is the argmax after the last accepted
node. Output is token-for-token the target's greedy output.
Sampling: recursive rejection sampling over siblings (SpecInfer, arXiv 2305.09781; the
per-node rule of arXiv 2211.17192). At a node with target distribution p, the children
are tried in order: child x with draft distribution q is accepted with probability
min(1, p(x)/q(x)); on rejection p <- norm(max(0, p - q)) and the next sibling is tried.
If no child is accepted the bonus token is drawn from the current p. The output then
follows the target's distribution exactly, for chains and trees alike.

The accepted path's KV entries are compacted right after the committed prefix, so the
cache afterwards looks exactly like a plain decode of the same tokens.
"""

from __future__ import annotations

import torch

from workers.embedded.model import KVCache, LlamaForCausalLM
from workers.embedded.speculative.draft import Draft, attention_layout
from workers.embedded.speculative.result import VerifyResult
from workers.embedded.speculative.sampling import Sampler, acceptance_probability, residual


def verify(
    model: LlamaForCausalLM,
    cache: KVCache,
    root: int,
    draft: Draft,
    sampler: Sampler,
) -> VerifyResult:
    """Score root + draft in one forward, accept a path, leave root + path in the cache."""
    start = cache.length  # the root's position
    device = model.lm_head.weight.device
    n = len(draft)
    aux_tokens = draft.aux.tokens if draft.aux is not None else []
    tokens = torch.tensor([[root, *draft.tokens, *aux_tokens]], device=device)  # (1, T)
    mask, offsets = attention_layout(draft, device)
    positions = None
    if mask is not None:
        positions = torch.tensor(offsets, device=device) + start  # (T,)
    out = model(
        tokens, cache, positions=positions, tree_mask=mask, last_only=n == 0 and not aux_tokens
    )
    path, bonus = accept(draft, out.logits[0, : 1 + n], sampler)
    kept = [0, *(1 + i for i in path)]
    if kept[-1] == len(kept) - 1:  # a prefix of the forward's rows: no copy needed
        cache.commit()
        cache.rollback(start + len(kept))
        hidden = out.hidden[0, : len(kept)]
    else:
        index = torch.tensor(kept, device=device)
        cache.keep(start, index)
        hidden = out.hidden[0].index_select(0, index)
    return VerifyResult(
        accepted=[draft.tokens[i] for i in path],
        accepted_nodes=path,
        bonus=bonus,
        hidden=hidden,
        aux_logits=out.logits[0, 1 + n :] if aux_tokens else None,
        num_proposed=n,
    )


def accept(draft: Draft, logits: torch.Tensor, sampler: Sampler) -> tuple[list[int], int]:
    """Accepted node indices (root to leaf) and the bonus token, given target logits
    (1 + n, V) for the root and every node."""
    if sampler.greedy:
        return _walk_greedy(draft, logits)
    return _walk_sampled(draft, sampler.probs(logits), sampler)


def _walk_greedy(draft: Draft, logits: torch.Tensor) -> tuple[list[int], int]:
    best = logits.argmax(-1).tolist()  # (1 + n,) target choice after each row
    children = draft.children()
    path: list[int] = []
    row = 0
    while True:
        nxt = next((c for c in children[row] if draft.tokens[c] == best[row]), None)
        if nxt is None:
            return path, best[row]
        path.append(nxt)
        row = 1 + nxt


def _walk_sampled(draft: Draft, probs: torch.Tensor, sampler: Sampler) -> tuple[list[int], int]:
    children = draft.children()
    path: list[int] = []
    row = 0
    p = probs[0]
    while True:
        accepted = None
        for c in children[row]:
            x = draft.tokens[c]
            q = draft.q[c] if draft.q is not None else None
            if sampler.uniform() < acceptance_probability(p, x, q):
                accepted = c
                break
            p = residual(p, x, q)
        if accepted is None:
            return path, sampler.sample(p)
        path.append(accepted)
        row = 1 + accepted
        p = probs[row]
