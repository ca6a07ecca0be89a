"""What one verify step returns; the drafters read the previous one from `DecodeState`.

Legend: a accepted nodes, A auxiliary tokens, V vocabulary, C hidden size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VerifyResult:
    accepted: list[int]  # accepted draft tokens, in path order
    accepted_nodes: list[int]  # their node indices in the draft
    bonus: int  # token from the target after the accepted path
    hidden: torch.Tensor  # (a + 1, C) target features of the root and the accepted nodes
    aux_logits: torch.Tensor | None  # (A, V) target logits of the aux branch
    num_proposed: int
    logits: torch.Tensor  # (a + 1, V) the target logits that chose each committed token,
    # after the request's processors (bias, penalties, grammar)

    @property
    def tokens(self) -> list[int]:
        """Tokens committed by this step: the accepted path, then the bonus token."""
        return [*self.accepted, self.bonus]
