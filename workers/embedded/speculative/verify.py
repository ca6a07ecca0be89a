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
cache afterwards looks exactly like a plain decode of the same tokens. `VerifyStep` splits
the step around the forward, so that the engine scores the drafts of all its running
requests in one batched target forward and accepts each on its own rows.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workers.embedded.model import ForwardOutput, KVCache, LlamaForCausalLM, SequenceInput
from workers.embedded.speculative.draft import Draft, attention_layout
from workers.embedded.speculative.processors import TokenProcessor
from workers.embedded.speculative.result import VerifyResult
from workers.embedded.speculative.sampling import Sampler, acceptance_probability, residual


def verify(
    model: LlamaForCausalLM,
    cache: KVCache,
    root: int,
    draft: Draft,
    sampler: Sampler,
    processor: TokenProcessor | None = None,
) -> VerifyResult:
    """Score root + draft in one forward, accept a path, leave root + path in the cache."""
    step = VerifyStep(cache, root, draft, model.lm_head.weight.device)
    return step.finish(model.forward_batch([step.input])[0], sampler, processor)


class VerifyStep:
    """`verify()` in two halves around the target forward, so that one forward can score
    the drafts of several requests (the engine batches their `input`s)."""

    def __init__(self, cache: KVCache, root: int, draft: Draft,
                 device: torch.device | str = "cpu") -> None:
        self.cache, self.draft = cache, draft
        self.start = cache.length  # the root's position
        aux_tokens = draft.aux.tokens if draft.aux is not None else []
        self.has_aux = bool(aux_tokens)
        mask, offsets = attention_layout(draft, device)
        positions = None
        if mask is not None:
            positions = torch.tensor(offsets, device=device) + self.start  # (T,)
        self.input = SequenceInput(
            tokens=torch.tensor([root, *draft.tokens, *aux_tokens], device=device),  # (T,)
            cache=cache,
            positions=positions,
            tree_mask=mask,
            last_only=len(draft) == 0 and not aux_tokens,
        )

    def finish(self, out: ForwardOutput, sampler: Sampler,
               processor: TokenProcessor | None = None) -> VerifyResult:
        """Accept a path from the forward's logits; compact root + path in the cache."""
        draft, cache, start = self.draft, self.cache, self.start
        n = len(draft)
        path, bonus, rows = accept(draft, out.logits[0, : 1 + n], sampler, processor)
        kept = [0, *(1 + i for i in path)]
        if kept[-1] == len(kept) - 1:  # a prefix of the forward's rows: no copy needed
            cache.commit()
            cache.rollback(start + len(kept))
            hidden = out.hidden[0, : len(kept)]
        else:
            index = torch.tensor(kept, device=out.hidden.device)
            cache.keep(start, index)
            hidden = out.hidden[0].index_select(0, index)
        return VerifyResult(
            accepted=[draft.tokens[i] for i in path],
            accepted_nodes=path,
            bonus=bonus,
            hidden=hidden,
            aux_logits=out.logits[0, 1 + n :] if self.has_aux else None,
            num_proposed=n,
            logits=rows,
        )


def accept(draft: Draft, logits: torch.Tensor, sampler: Sampler,
           processor: TokenProcessor | None = None) -> tuple[list[int], int, torch.Tensor]:
    """Accepted node indices (root to leaf), the bonus token, and the logits (a + 1, V) that
    chose each committed token (processed, when a processor shapes them), given target
    logits (1 + n, V) for the root and every node. A processor is applied to each row
    visited, in path order, and advanced by each committed token."""
    if processor is None:
        if sampler.greedy:
            path, bonus = _walk_greedy(draft, logits)
        else:
            probs = sampler.probs(logits)  # (1 + n, V) all rows in one call
            path, bonus = _walk_sampled(draft, probs.__getitem__, sampler, lambda _: None)
        return path, bonus, logits[[0, *(1 + i for i in path)]]
    rows: list[torch.Tensor] = []

    def processed(row: int) -> torch.Tensor:
        rows.append(processor.apply(logits[row]))
        return rows[-1]

    if sampler.greedy:
        path, bonus = _walk_greedy_processed(draft, processed, processor)
    else:
        path, bonus = _walk_sampled(draft, lambda row: sampler.probs(processed(row)), sampler,
                                    processor.advance)
    return path, bonus, torch.stack(rows)


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


def _walk_greedy_processed(draft: Draft, processed: Callable[[int], torch.Tensor],
                           processor: TokenProcessor) -> tuple[list[int], int]:
    children = draft.children()
    path: list[int] = []
    row = 0
    while True:
        best = int(processed(row).argmax())
        processor.advance(best)
        nxt = next((c for c in children[row] if draft.tokens[c] == best), None)
        if nxt is None:
            return path, best
        path.append(nxt)
        row = 1 + nxt


def _walk_sampled(draft: Draft, row_probs: Callable[[int], torch.Tensor], sampler: Sampler,
                  commit: Callable[[int], None]) -> tuple[list[int], int]:
    children = draft.children()
    path: list[int] = []
    row = 0
    p = row_probs(0)
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
            bonus = sampler.sample(p)
            commit(bonus)
            return path, bonus
        commit(draft.tokens[accepted])
        path.append(accepted)
        row = 1 + accepted
        p = row_probs(row)
