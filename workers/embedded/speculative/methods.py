"""The decoding methods an engine offers: name -> drafter factory and default k.

Weightless methods are always there; drafters with weights (Medusa heads, EAGLE head,
draft model) are added by `load_methods` when their files sit in the model folder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.draft import Drafter
from workers.embedded.speculative.lookahead import LookaheadDrafter
from workers.embedded.speculative.ngram import NgramDrafter, NoDraft


@dataclass(frozen=True)
class Method:
    name: str
    new_drafter: Callable[[], Drafter]  # one drafter per generation
    default_k: int  # draft tokens (tree nodes) per step; 0 = plain


def builtin_methods() -> dict[str, Method]:
    return {
        "plain": Method("plain", NoDraft, 0),
        "ngram": Method("ngram", NgramDrafter, 8),
        "lookahead": Method("lookahead", LookaheadDrafter, 12),
    }


def load_methods(model_dir: Path | None, model: LlamaForCausalLM) -> dict[str, Method]:
    """Built-in methods plus those whose drafter weights are in `model_dir`.

    Part-2 drafters plug in here: check for their files, load them onto the model's
    device/dtype, and add a Method whose factory closes over the loaded weights.
    """
    return builtin_methods()
