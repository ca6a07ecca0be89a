"""The decoding methods an engine offers: name -> drafter factory and default k.

Weightless methods are always there; drafters with weights (Medusa heads, EAGLE head,
draft model) are added by `load_methods` where `workers.models.drafter_dir_for` finds
them: the model folder itself (the bundled model), else the repository's
`weights/<model folder name>/` (SmolLM2: base in the user cache, drafters shipped here) —
the same rule `specroute up` uses to decide which methods a model serves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch

from policies.methods import DEFAULT_K
from workers.embedded.checkpoint import load_model
from workers.embedded.drafter_models import EagleHead, MedusaHeads, load_drafter
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.speculative.draft import Drafter
from workers.embedded.speculative.draft_model import DraftModelDrafter
from workers.embedded.speculative.eagle import EagleChainDrafter
from workers.embedded.speculative.eagle2 import EagleTreeDrafter
from workers.embedded.speculative.hybrid import HybridConfig, HybridDrafter
from workers.embedded.speculative.lookahead import LookaheadDrafter
from workers.embedded.speculative.medusa import MedusaDrafter
from workers.embedded.speculative.ngram import NgramDrafter, NoDraft
from workers.models import drafter_dir_for

_Module = TypeVar("_Module", MedusaHeads, EagleHead)


@dataclass(frozen=True)
class EngineMethod:
    """A method as this engine runs it: its drafter factory and default k. The method's
    name is a `policies.methods.Method` value (or a test's own)."""

    name: str
    new_drafter: Callable[[], Drafter]  # one drafter per generation
    default_k: int  # draft tokens (tree nodes) per step; 0 = plain


def builtin_methods() -> dict[str, EngineMethod]:
    return {
        "plain": EngineMethod("plain", NoDraft, 0),
        "ngram": EngineMethod("ngram", NgramDrafter, DEFAULT_K["ngram"]),
        "lookahead": EngineMethod("lookahead", LookaheadDrafter, DEFAULT_K["lookahead"]),
    }


def load_methods(model_dir: Path | None, model: LlamaForCausalLM) -> dict[str, EngineMethod]:
    """Built-in methods plus those whose drafter weights `drafter_dir_for(model_dir)` finds:
    `medusa/` -> medusa; `eagle/` -> eagle (chain), eagle2 (dynamic tree) and hybrid
    (n-gram where the context matches, else the chain); `draft/` -> draft. Weights load once, onto the model's device (and dtype, but see `dtype` below);
    drafters share them."""
    methods = builtin_methods()
    folder = drafter_dir_for(model_dir) if model_dir is not None else None
    if folder is None:
        return methods
    weight = model.lm_head.weight
    # A drafter's precision moves its acceptance, never the output (verification decides):
    # where the model's products run bf16 (4-bit layers) its drafters' do too, on int8
    # codes (`layers.Int8Linear`: several times faster than bf16 products of their sizes).
    dtype = torch.bfloat16 if model.four_bit else weight.dtype
    if (folder / "medusa" / "config.json").exists():
        heads = _load(folder / "medusa", MedusaHeads, weight, dtype)
        methods["medusa"] = EngineMethod("medusa", lambda: MedusaDrafter(model, heads),
                                         DEFAULT_K["medusa"])
    if (folder / "eagle" / "config.json").exists():
        head = _load(folder / "eagle", EagleHead, weight, dtype)
        cutoff = chain_confidence(head)
        methods["eagle"] = EngineMethod("eagle", lambda: EagleChainDrafter(model, head, cutoff),
                                        DEFAULT_K["eagle"])
        methods["eagle2"] = EngineMethod("eagle2", lambda: EagleTreeDrafter(model, head),
                                         DEFAULT_K["eagle2"])
        hybrid = HybridConfig(min_confidence=cutoff)
        methods["hybrid"] = EngineMethod("hybrid", lambda: HybridDrafter(model, head, hybrid),
                                         DEFAULT_K["hybrid"])
    if (folder / "draft" / "config.json").exists():
        draft = load_model(folder / "draft", dtype=weight.dtype, device=weight.device)
        length = model.config.max_position_embeddings
        methods["draft"] = EngineMethod("draft", lambda: DraftModelDrafter(draft, length),
                                        DEFAULT_K["draft"])
    return methods


def chain_confidence(head: EagleHead) -> float:
    """The EAGLE chain's cutoff: the head's measured `chain_confidence`, or
    SPECROUTE_EAGLE_CHAIN_CONFIDENCE where set (0: chains of k tokens, as before it)."""
    value = os.environ.get("SPECROUTE_EAGLE_CHAIN_CONFIDENCE")
    return head.config.chain_confidence if value is None else float(value)


def _load(folder: Path, kind: type[_Module], like: torch.Tensor, dtype: torch.dtype) -> _Module:
    module = load_drafter(folder, dtype=dtype, device=like.device,
                          int8=dtype == torch.bfloat16)
    if not isinstance(module, kind):
        raise ValueError(f"{folder} holds a {type(module).__name__}, expected {kind.__name__}")
    return module
