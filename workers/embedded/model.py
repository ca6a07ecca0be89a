"""A Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention), one sequence or
a ragged batch of them per forward (its KV cache: `kv_cache`).

Parameter names follow the Hugging Face `LlamaForCausalLM` layout, so a folder with
`config.json` + `model.safetensors` loads with no renaming. RoPE uses the Hugging Face
"rotate half" convention.

Legend: B batch, T new tokens, L cached tokens, nh query heads, nkv key/value heads,
hs head size, C hidden size, V vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from workers.embedded.kv_cache import KVCache
from workers.embedded.layers import (
    Embedding,
    InferenceWeight,
    RMSNorm,
    apply_rope,
    attention_inputs,
    fuse_linears,
    rope_tables,
    signed,
    unread_weights,
)

__all__ = ["KVCache", "RMSNorm", "apply_rope", "attention_inputs", "rope_tables", "signed"]

@dataclass
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 704
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    bos_token_id: int = 1
    eos_token_id: int = 2
    head_dim: int = field(default=0)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    @classmethod
    def from_dict(cls, raw: dict) -> ModelConfig:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in raw.items() if k in known and v is not None}
        if isinstance(values.get("eos_token_id"), list):
            values["eos_token_id"] = values["eos_token_id"][0]
        return cls(**values)

    def to_hf_dict(self) -> dict:
        out = asdict(self)
        out.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu")
        return out


@dataclass
class SequenceInput:
    """One sequence's share of a ragged batch forward (`LlamaForCausalLM.forward_batch`).

    tokens (T,) run after `cache`'s committed prefix at `positions` (default
    prefix_length + arange(T)), seeing each other per `tree_mask` (same conventions as
    `forward`); `last_only`: logits for the last token only.
    """

    tokens: torch.Tensor
    cache: KVCache
    positions: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    last_only: bool = False


@dataclass
class RaggedSequence:
    cache: KVCache
    mask: torch.Tensor | None  # (1, 1, T, L+T) or None: causal
    rows: slice  # its tokens in the flattened batch


class RaggedBatch:
    """Sequences flattened into one row of N = sum(T) tokens: every layer's projections and
    MLP run once over all N tokens, attention runs per sequence over its own cache. This is
    Orca's selective batching (Yu et al., OSDI 2022) and the flattened token batch of vLLM
    and SGLang: no padding, so a plain decode (T = 1) next to an 8-node tree costs 9 rows,
    not 18, and each sequence keeps its own KVCache (append, commit, rollback, keep)."""

    def __init__(self, sequences: list[RaggedSequence]) -> None:
        self.sequences = sequences


class Attention(nn.Module):
    """Grouped-query attention. `fuse()` (inference) adds inference copies
    (`layers.InferenceWeight`) of the concatenated q/k/v weight, (nh + 2 nkv) hs x C, and
    of o: a forward they serve runs one q/k/v projection and RoPE on q and k in one call —
    through 4-bit codes where the checkpoint is 4-bit, else through the packed float32
    copy past one row. Any other forward, and any with autograd
    on, runs the three parameters themselves (memory-mapped from the checkpoint and shared
    between workers; `layers.pack` says why one float32 row stays on them). Fuse after any
    `.to()` and after the weights are final: the copies are not parameters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, hs = config.hidden_size, config.head_dim
        self.n_head, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.hs = hs
        self.q_proj = nn.Linear(c, self.n_head * hs, bias=False)
        self.k_proj = nn.Linear(c, self.n_kv * hs, bias=False)
        self.v_proj = nn.Linear(c, self.n_kv * hs, bias=False)
        self.o_proj = nn.Linear(self.n_head * hs, c, bias=False)
        self.inference: tuple[InferenceWeight, InferenceWeight] | None = None  # qkv, o

    def fuse(self) -> None:
        """Inference copies of q, k, v concatenated and of o (made once); the parameters
        stay as they are."""
        if self.inference is None:
            self.inference = (
                InferenceWeight(fuse_linears(self.q_proj, self.k_proj, self.v_proj)),
                InferenceWeight(self.o_proj.weight.detach()))

    def unread_weights(self) -> list[torch.Tensor]:
        """The parameters no inference product reads (see `unread_weights`)."""
        return unread_weights(self.inference, ((self.q_proj, self.k_proj, self.v_proj), (self.o_proj,)))

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | RaggedBatch | None,
        layer: int,
    ) -> torch.Tensor:
        """x (B, T, C); cos, sin (1, 1, T, hs), sin signed (`apply_rope`)."""
        b, t, _ = x.shape
        nh, nkv, hs = self.n_head, self.n_kv, self.hs
        fused = self.inference
        if fused is not None and (torch.is_grad_enabled() or not fused[0].serves(b * t)
                                  or not fused[1].serves(b * t)):
            fused = None
        if fused is not None:
            qkv = fused[0](x).view(b, t, nh + 2 * nkv, hs)  # (B, T, nh+2nkv, hs)
            qk = apply_rope(qkv[:, :, : nh + nkv], cos.transpose(1, 2), sin.transpose(1, 2))
            q = qk[:, :, :nh].transpose(1, 2)  # (B, nh, T, hs)
            k = qk[:, :, nh:].transpose(1, 2)  # (B, nkv, T, hs)
            v = qkv[:, :, nh + nkv :].transpose(1, 2)
        else:
            q = self.q_proj(x).view(b, t, nh, hs).transpose(1, 2)  # (B, nh, T, hs)
            k = self.k_proj(x).view(b, t, nkv, hs).transpose(1, 2)  # (B, nkv, T, hs)
            v = self.v_proj(x).view(b, t, nkv, hs).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if isinstance(cache, RaggedBatch):  # (1, nh, N, hs): each sequence on its own cache
            parts = [
                self._attend(q[:, :, s.rows],
                             *s.cache.append(layer, k[:, :, s.rows], v[:, :, s.rows]), s.mask)
                for s in cache.sequences
            ]
            y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)
        else:
            if cache is not None:
                k, v = cache.append(layer, k, v)  # (B, nkv, L+T, hs)
            y = self._attend(q, k, v, mask)
        y = y.transpose(1, 2).reshape(b, t, nh * hs)  # (B, T, C)
        return self.o_proj(y) if fused is None else fused[1](y)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        """q (B, nh, T, hs) over k, v (B, nkv, L+T, hs); mask None = causal (or one query).
        enable_gqa: each k/v head serves nh / nkv query heads with no repeat_interleave
        copy of the cache."""
        gqa = self.n_kv != self.n_head
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1,
                                                  enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=gqa)  # (B, nh, T, hs)


class MLP(nn.Module):
    """SwiGLU; `fuse()` adds inference copies of gate and up as one 2F x C weight and of
    down, used by the forwards they serve with autograd off (as `Attention.fuse`)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(c, f, bias=False)
        self.up_proj = nn.Linear(c, f, bias=False)
        self.down_proj = nn.Linear(f, c, bias=False)
        self.inference: tuple[InferenceWeight, InferenceWeight] | None = None  # gate_up, down

    def fuse(self) -> None:
        if self.inference is None:
            self.inference = (InferenceWeight(fuse_linears(self.gate_proj, self.up_proj)),
                              InferenceWeight(self.down_proj.weight.detach()))

    def unread_weights(self) -> list[torch.Tensor]:
        """The parameters no inference product reads (see `unread_weights`)."""
        return unread_weights(self.inference, ((self.gate_proj, self.up_proj), (self.down_proj,)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused, rows = self.inference, x.numel() // x.shape[-1]
        if (fused is not None and not torch.is_grad_enabled() and fused[0].serves(rows)
                and fused[1].serves(rows)):
            gate, up = fused[0](x).chunk(2, dim=-1)
            return fused[1](F.silu(gate).mul_(up))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward(self, x, cos, sin, mask, cache, layer) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """`model.*` in the Hugging Face layout: embeddings, decoder layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (B, T, V) float32
    hidden: torch.Tensor  # (B, T, C) final normed feature (EAGLE's input, Medusa's base)


class LlamaForCausalLM(nn.Module):
    rope_cos: torch.Tensor  # buffers, registered in __init__
    rope_sin: torch.Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", signed(sin), persistent=False)  # apply_rope's table
        self.lm_inference: InferenceWeight | None = None  # set by fuse()

    def fuse(self) -> LlamaForCausalLM:
        """Inference copies of every layer's fused projections and of the LM head (see
        `Attention.fuse`); outputs equal the unfused model's within float rounding (bf16
        products where the checkpoint is 4-bit). Without oneDNN or 4-bit weights (or off
        the CPU) nothing changes."""
        for layer in self.model.layers:
            DecoderLayer.fuse(layer)  # type: ignore[arg-type]  # a ModuleList of them
        if self.lm_inference is None:
            # Where the layers run 4-bit the head (8-bit in the GGUF: not 4-bit codes)
            # stays float32: a bf16 head, though faster, rounds logits to ~0.1 at 25,
            # and SmolLM2's top two often lie closer (0.08 apart, seen; docs/WORKER.md).
            self.lm_inference = InferenceWeight(self.lm_head.weight.detach())
        return self

    def unread_weights(self) -> list[torch.Tensor]:
        """The layer weights that, after `fuse()`, only autograd-on forwards read: those
        with 4-bit inference copies."""
        layers: list[DecoderLayer] = list(self.model.layers)  # type: ignore[arg-type]
        return [w for layer in layers
                for w in layer.self_attn.unread_weights() + layer.mlp.unread_weights()]

    @property
    def four_bit(self) -> bool:
        """Whether `fuse()` found the layers' weights 4-bit (`layers.int4_codes`): decode
        and verify products then run in bf16 on the checkpoint's codes."""
        first: DecoderLayer = self.model.layers[0]  # type: ignore[assignment]
        copies = first.self_attn.inference
        return copies is not None and copies[0].int4 is not None

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head over hidden (..., C): logits (..., V) float32, through the head's
        inference copy where it serves the rows (`fuse()`)."""
        head = self.lm_inference
        if head is None or torch.is_grad_enabled() or not head.serves(hidden.numel() // hidden.shape[-1]):
            return self.lm_head(hidden).float()
        return head(hidden).float()

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> ForwardOutput:
        """Run T new tokens (B, T) after the cache's committed prefix.

        positions: (T,) absolute positions; default prefix_length + arange(T).
        tree_mask: (T, T) bool, True where new token i may attend to new token j
        (a draft tree); default causal. The cache's entries are always visible.
        last_only: logits for the last token only (hidden stays (B, T, C): EAGLE reads the
        prompt's features after prefill).
        The new entries stay pending in the cache until `cache.commit()`.
        """
        b, t = tokens.shape
        past = cache.length if cache is not None else 0
        if positions is None:
            positions = torch.arange(past, past + t, device=tokens.device)
        cos, sin, mask = attention_inputs(self.rope_cos, self.rope_sin, positions, past, tree_mask,
                                          self.lm_head.weight.dtype)
        x = self.model.embed_tokens(tokens)  # (B, T, C)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i)
        hidden = self.model.norm(x)  # (B, T, C)
        logits = self.logits(hidden[:, -1:] if last_only else hidden)  # (B, T or 1, V)
        return ForwardOutput(logits=logits, hidden=hidden)

    def forward_batch(self, inputs: list[SequenceInput]) -> list[ForwardOutput]:
        """One forward over several sequences of any lengths, each after its own cache
        (see `RaggedBatch`). Returns per sequence what `forward` would for it alone:
        logits (1, T or 1, V), hidden (1, T, C); new entries stay pending in each cache."""
        device = self.lm_head.weight.device
        dtype = self.lm_head.weight.dtype
        sequences: list[RaggedSequence] = []
        cos_rows, sin_rows, logit_rows = [], [], []
        offset = 0
        for item in inputs:
            t, past = item.tokens.shape[0], item.cache.length
            positions = item.positions
            if positions is None:
                positions = torch.arange(past, past + t, device=device)
            cos, sin, mask = attention_inputs(self.rope_cos, self.rope_sin, positions, past,
                                              item.tree_mask, dtype)
            cos_rows.append(cos)
            sin_rows.append(sin)
            sequences.append(RaggedSequence(item.cache, mask, slice(offset, offset + t)))
            logit_rows.append(range(offset + t - 1 if item.last_only else offset, offset + t))
            offset += t
        batch = RaggedBatch(sequences)
        cos, sin = torch.cat(cos_rows, dim=2), torch.cat(sin_rows, dim=2)  # (1, 1, N, hs)
        x = self.model.embed_tokens(torch.cat([item.tokens for item in inputs]))[None]  # (1, N, C)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, None, batch, i)
        hidden = self.model.norm(x)[0]  # (N, C)
        index = torch.tensor([r for rows in logit_rows for r in rows], device=device)
        logits = self.logits(hidden.index_select(0, index))  # (sum of rows, V)
        outputs: list[ForwardOutput] = []
        start = 0
        for seq, rows in zip(sequences, logit_rows, strict=True):
            outputs.append(ForwardOutput(logits=logits[None, start : start + len(rows)],
                                         hidden=hidden[None, seq.rows]))
            start += len(rows)
        return outputs

    def forward_each(self, inputs: list[SequenceInput]) -> list[ForwardOutput | Exception]:
        """`forward_batch`; if it fails, each sequence alone, so that one bad request does
        not fail the others (a failed forward leaves only uncommitted cache entries)."""
        if not inputs:
            return []
        try:
            return list(self.forward_batch(inputs))
        except Exception as exc:
            if len(inputs) == 1:
                return [exc]
        outputs: list[ForwardOutput | Exception] = []
        for item in inputs:
            try:
                outputs.append(self.forward_batch([item])[0])
            except Exception as exc:
                outputs.append(exc)
        return outputs

    def new_cache(self, batch_size: int = 1, max_length: int | None = None) -> KVCache:
        w = self.lm_head.weight
        return KVCache(self.config, batch_size, max_length, dtype=w.dtype, device=w.device)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
