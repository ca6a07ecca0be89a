"""The trained drafter networks that ride on the frozen base model.

- `MedusaHeads` (Cai et al. 2024, arXiv 2401.10774): H residual blocks on the base's final
  feature f_t; head i predicts token t+2+i through the base's own LM head.
- `EagleHead` (Li et al. 2024, arXiv 2401.15077): fc(concat(f_t, e(x_{t+1}))) followed by one
  decoder layer extrapolates the next feature f_{t+1}; the base's LM head turns it into
  draft logits. Its own one-layer KV cache makes chain and tree drafting incremental.
- The draft model is a small `LlamaForCausalLM` (same tokenizer), so it needs no class here.

Each drafter folder holds `config.json` + `model.safetensors`; only the drafter's own
weights are stored (embeddings, and the LM head unless a draft vocabulary is set, are the
base's).

Draft vocabulary (FR-Spec, Zhao et al. 2025, arXiv 2502.14856; EAGLE-3 also drafts over a
subset): with `draft_vocab_size` N > 0 a drafter owns an (N, C) output projection over the
N tokens listed in its `draft_vocab` buffer (the most frequent ones in its training data),
so a draft token costs N/V of the base's LM head. `draft_logits` scatters them into the
full vocabulary with -inf elsewhere: q is zero outside the subset, and verification, which
runs the target over the full vocabulary, stays exact.

Legend: B batch, T tokens, C hidden size, H Medusa heads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from workers.embedded.layers import int8_linears
from workers.embedded.model import (
    DecoderLayer,
    KVCache,
    ModelConfig,
    RaggedBatch,
    RaggedSequence,
    attention_inputs,
    rope_tables,
    signed,
)


@dataclass
class MedusaConfig:
    hidden_size: int = 256
    num_heads: int = 4
    num_layers: int = 1
    vocab_size: int = 0  # the base's V; needed only with a draft vocabulary
    draft_vocab_size: int = 0  # N; 0 = project through the base's LM head


class DraftVocabulary(nn.Module):
    """An (N, C) projection onto the N token ids in `draft_vocab` (a frequency-ranked subset)."""

    draft_vocab: torch.Tensor  # (N,) int64 token ids, a buffer saved with the weights

    def __init__(self, hidden_size: int, vocab_size: int, size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.proj = nn.Linear(hidden_size, size, bias=False)
        self.register_buffer("draft_vocab", torch.arange(size, dtype=torch.long))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features (..., C) -> logits (..., V) float32, -inf outside the draft vocabulary."""
        sub = self.proj(features).float()  # (..., N)
        out = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        out[..., self.draft_vocab] = sub
        return out


def draft_logits(features: torch.Tensor, vocabulary: DraftVocabulary | None,
                 base_lm_head: nn.Module) -> torch.Tensor:
    """Draft logits (..., V) float32 through the drafter's own vocabulary, else the base's head."""
    if vocabulary is None:
        return base_lm_head(features.to(next(base_lm_head.parameters()).dtype)).float()
    return vocabulary(features)


def _vocabulary(hidden_size: int, vocab_size: int, size: int) -> DraftVocabulary | None:
    if size <= 0:
        return None
    if not 0 < size <= vocab_size:
        raise ValueError(f"draft_vocab_size {size} needs 0 < N <= vocab_size ({vocab_size})")
    return DraftVocabulary(hidden_size, vocab_size, size)


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)  # starts as identity: head i == base head at init
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        self.config = config
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResBlock(config.hidden_size) for _ in range(config.num_layers)))
            for _ in range(config.num_heads)
        )
        self.vocabulary = _vocabulary(config.hidden_size, config.vocab_size,
                                      config.draft_vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (B, T, C) -> per-head features (H, B, T, C); logits = lm_head(features)."""
        return torch.stack([head(hidden) for head in self.heads])


@dataclass
class EagleConfig:
    hidden_size: int = 256
    intermediate_size: int = 704
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    vocab_size: int = 0  # the base's V; needed only with a draft vocabulary
    draft_vocab_size: int = 0  # N; 0 = project through the base's LM head
    # Serving, not the network: a chain ends where the product of the head's top
    # probabilities falls below this (`speculative.chain.chain_steps`); measured per
    # head, 0 = always k tokens.
    chain_confidence: float = 0.0

    def layer_config(self) -> ModelConfig:
        """The one decoder layer, described as a one-layer Llama config (for its KV cache)."""
        return ModelConfig(
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=1, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
        )


@dataclass
class HeadInput:
    """One sequence's share of `EagleHead.forward_batch`: pairs (f_t, e(x_(t+1))) after
    `cache`'s committed prefix, at `positions` (default: right after it), seeing each
    other per `tree_mask` (the conventions of `LlamaForCausalLM.forward`)."""

    features: torch.Tensor  # (T, C)
    embeddings: torch.Tensor  # (T, C)
    cache: KVCache
    positions: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None


class EagleHead(nn.Module):
    rope_cos: torch.Tensor  # buffers, registered in __init__
    rope_sin: torch.Tensor

    def __init__(self, config: EagleConfig) -> None:
        super().__init__()
        self.config = config
        self.layer_config = config.layer_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=True)
        self.layer = DecoderLayer(self.layer_config)
        cos, sin = rope_tables(self.layer_config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", signed(sin), persistent=False)  # apply_rope's table
        self.vocabulary = _vocabulary(config.hidden_size, config.vocab_size,
                                      config.draft_vocab_size)

    def forward(
        self,
        features: torch.Tensor,
        next_embeddings: torch.Tensor,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """features f_t (B, T, C) and embeddings of x_{t+1} (B, T, C) -> predicted f_{t+1}.

        Same cache/positions/tree_mask conventions as `LlamaForCausalLM.forward`: new
        entries stay pending until `cache.commit()`.
        """
        t = features.shape[1]
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + t, device=features.device)
        cos, sin, mask = attention_inputs(self.rope_cos, self.rope_sin, positions, past, tree_mask,
                                          self.fc.weight.dtype)
        x = self.fc(torch.cat([features, next_embeddings.to(features.dtype)], dim=-1))  # (B, T, C)
        return self.layer(x, cos, sin, mask, cache, 0)

    def forward_batch(self, inputs: list[HeadInput]) -> torch.Tensor:
        """Several sequences' pairs in one forward, each after its own cache (a ragged
        batch: fc, projections and MLP run once over all N rows, attention per sequence).
        Returns the predicted features (N, C), rows in input order; what `forward` gives
        each alone. New entries stay pending in each cache until its `commit()`."""
        dtype = self.fc.weight.dtype
        sequences, cos_rows, sin_rows, offset = [], [], [], 0
        for item in inputs:
            t, past = item.features.shape[0], item.cache.length
            positions = item.positions
            if positions is None:
                positions = torch.arange(past, past + t, device=item.features.device)
            cos, sin, mask = attention_inputs(self.rope_cos, self.rope_sin, positions, past,
                                              item.tree_mask, dtype)
            cos_rows.append(cos)
            sin_rows.append(sin)
            sequences.append(RaggedSequence(item.cache, mask, slice(offset, offset + t)))
            offset += t
        pairs = torch.cat([torch.cat([item.features.to(dtype), item.embeddings.to(dtype)], dim=-1)
                           for item in inputs])  # (N, 2C)
        x = self.fc(pairs)[None]  # (1, N, C)
        cos, sin = torch.cat(cos_rows, dim=2), torch.cat(sin_rows, dim=2)  # (1, 1, N, hs)
        return self.layer(x, cos, sin, None, RaggedBatch(sequences), 0)[0]

    def new_cache(self, max_length: int | None = None) -> KVCache:
        w = self.fc.weight
        return KVCache(self.layer_config, 1, max_length, dtype=w.dtype, device=w.device)


_KINDS = {"medusa": (MedusaConfig, MedusaHeads), "eagle": (EagleConfig, EagleHead)}


def save_drafter(module: MedusaHeads | EagleHead, kind: str, folder: str | Path,
                 extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
             for k, v in module.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    meta = {"drafter": kind, **asdict(module.config), **(extra or {})}
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")


def load_drafter(folder: str | Path, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu", int8: bool = False
                 ) -> MedusaHeads | EagleHead:
    """A drafter for inference; `int8`: its linears on int8 codes (`layers.int8_linears`)."""
    from safetensors.torch import load_file

    meta = json.loads((Path(folder) / "config.json").read_text())
    config_cls, module_cls = _KINDS[meta["drafter"]]
    names = {f.name for f in fields(config_cls)}
    known = {k: v for k, v in meta.items() if k in names}
    module = module_cls(config_cls(**known))
    module.load_state_dict(load_file(str(Path(folder) / "model.safetensors")))
    module = module.to(device=device, dtype=dtype).eval()
    if int8:
        return int8_linears(module)  # type: ignore[return-value]  # every product on codes
    if isinstance(module, EagleHead):
        module.layer.fuse()  # its one decoder layer, as the base model's (inference only)
    return module
