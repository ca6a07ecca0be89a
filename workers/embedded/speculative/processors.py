"""Per-position changes to the target's logits: logit bias, penalties, a grammar's mask.

Such a change depends on what came before the position (the penalties count the tokens
generated so far, a grammar's mask is its matcher's state), so along a draft path it
differs row by row: verification applies it to each row it visits and advances it by the
token committed there (`verify.accept`). The processed row is the target distribution
that greedy decoding takes the argmax of and that the rejection rule compares drafts
with, so speculative output still equals (greedy) or follows (sampling) constrained
plain decoding. A processor advances only through tokens that are committed, never
through draft tokens, so a rejected draft needs no undoing.

Legend: V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from workers.embedded.api import SamplingParams


class TokenProcessor(Protocol):
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits (V,) at the next position, changed; never modified in place."""
        ...

    def advance(self, token: int) -> None:
        """`token` was committed at that position."""
        ...


class LogitBias:
    """OpenAI `logit_bias`: a fixed value added to some tokens' logits."""

    def __init__(self, bias: dict[int, float], vocab_size: int, device: torch.device) -> None:
        self.bias = torch.zeros(vocab_size, device=device)  # (V,)
        for token, value in bias.items():
            self.bias[token] = value

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self.bias.to(logits.dtype)

    def advance(self, token: int) -> None:
        pass


class Penalties:
    """OpenAI presence and frequency penalties over the generated tokens (not the prompt,
    as OpenAI and vLLM define them): logit -= presence * [count > 0] + frequency * count."""

    def __init__(self, presence: float, frequency: float, vocab_size: int,
                 device: torch.device) -> None:
        self.presence, self.frequency = presence, frequency
        self.counts = torch.zeros(vocab_size, device=device)  # (V,)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        penalty = self.presence * (self.counts > 0) + self.frequency * self.counts
        return logits - penalty.to(logits.dtype)

    def advance(self, token: int) -> None:
        self.counts[token] += 1


class Processors:
    """Several processors in order (bias, penalties, then the grammar's mask last, so that
    nothing can lift a token the grammar forbids)."""

    def __init__(self, items: Sequence[TokenProcessor]) -> None:
        self.items = list(items)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for item in self.items:
            logits = item.apply(logits)
        return logits

    def advance(self, token: int) -> None:
        for item in self.items:
            item.advance(token)


def build_processors(params: SamplingParams, vocab_size: int, device: torch.device,
                     grammar: TokenProcessor | None) -> TokenProcessor | None:
    """A request's processors, in order; None when nothing changes its logits."""
    items: list[TokenProcessor] = []
    if params.logit_bias:
        items.append(LogitBias(params.logit_bias, vocab_size, device))
    if params.presence_penalty or params.frequency_penalty:
        items.append(Penalties(params.presence_penalty, params.frequency_penalty, vocab_size,
                               device))
    if grammar is not None:
        items.append(grammar)
    if not items:
        return None
    return items[0] if len(items) == 1 else Processors(items)
