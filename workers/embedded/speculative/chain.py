"""A draft chain from an autoregressive drafter (the EAGLE head, a draft model).

Legend: V vocabulary, q draft probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

import torch

from workers.embedded.speculative.draft import Draft, DraftConstraint
from workers.embedded.speculative.sampling import Sampler


def draft_chain(
    logits: torch.Tensor,
    steps: int,
    sampler: Sampler,
    advance: Callable[[int, torch.Tensor], torch.Tensor],
    constraint: DraftConstraint | None = None,
) -> Draft:
    """A chain of `steps` tokens from an autoregressive drafter, starting from `logits` (V,).

    `advance(depth, token (1,))` feeds the drafted token and returns the logits for the
    next position; it is not called after the last token. The chain itself is
    `chain_steps`'s."""
    chain = chain_steps(logits, steps, sampler, constraint)
    depth = 0
    try:
        token = next(chain)
        while True:
            token = chain.send(advance(depth, token))
            depth += 1
    except StopIteration as done:
        return done.value


def chain_steps(
    logits: torch.Tensor,
    steps: int,
    sampler: Sampler,
    constraint: DraftConstraint | None = None,
    min_confidence: float = 0.0,
) -> Generator[torch.Tensor, torch.Tensor, Draft]:
    """The chain as a generator: yields each drafted token (1,) whose successor's logits
    (V,) it needs and is sent them; returns the draft. A driver may so draft several
    sequences in lock-step (`lockstep.draft_together`).

    Greedy: argmax, q = None. Sampling: x ~ q with q = sampler.probs(logits), carried in the
    draft for min(1, p/q). Under a `constraint` (a request's grammar) each position's
    logits are masked first, so q is the masked distribution actually drawn from; once the
    grammar is done, drafting goes on unmasked (verification prunes what it forbids) so
    that the drafter sees every step.

    `min_confidence`: the chain stops before a token past the first once the product of
    the draft's top probabilities so far (this position's included) falls below it — a
    chain of dynamic length, as EAGLE-2 sizes its trees by the same product (arXiv
    2406.16858, which shows it tracks acceptance). The test is made before the token is
    drawn and reads only the draft's distribution, never the token drawn, so whether
    position i gets a draft depends on the accepted prefix alone and verification stays
    exact (a position without a draft samples the target). Where it pays: an extra
    verify row and head forward cost a fixed share of a step, so a token accepted less
    often than that share costs more than it brings; the product tracks acceptance there
    (figures: docs/WORKER.md, "The decode step"; docs/results/2026-12-05-engine-vllm.md).
    """
    tokens: list[torch.Tensor] = []  # (1,) each; greedy stays on the device, no sync
    qs: list[torch.Tensor] = []
    masked = constraint is not None
    confidence = 1.0  # product of the draft's top probabilities so far
    for depth in range(steps):
        if masked:
            logits = constraint.restrict(logits)  # type: ignore[union-attr]
        q = None if sampler.greedy else sampler.probs(logits)
        if min_confidence > 0.0:
            top = (q if q is not None else torch.softmax(logits.float(), -1)).max()
            confidence *= float(top)
            if depth > 0 and confidence < min_confidence:
                break
        if q is None:
            token = logits.argmax().view(1)
        else:
            token = torch.multinomial(q, 1, generator=sampler.generator)
            qs.append(q)
        tokens.append(token)
        if masked:
            masked = constraint.push(int(token))  # type: ignore[union-attr]
        if depth + 1 < steps:
            logits = yield token
    if constraint is not None:
        constraint.undo()
    draft_tokens = torch.cat(tokens).tolist() if tokens else []
    return Draft.chain(draft_tokens, torch.stack(qs) if qs else None)
