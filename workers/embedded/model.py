"""A Llama-family decoder (RMSNorm, RoPE, SwiGLU, grouped-query attention) and its KV cache.

Parameter names follow the Hugging Face `LlamaForCausalLM` layout, so a folder with
`config.json` + `model.safetensors` loads with no renaming. RoPE uses the Hugging Face
"rotate half" convention.

Legend: B batch, T new tokens, L cached tokens, nh query heads, nkv key/value heads,
hs head size, C hidden size, V vocabulary.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


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


class KVCache:
    """Preallocated keys and values for every layer, with explicit append and rollback.

    Positions [0, length) hold committed tokens. `append` writes new entries after them;
    `rollback(n)` forgets everything from position n; `keep(indices)` compacts a verified
    tree path so that its entries become contiguous after the committed prefix.
    """

    def __init__(
        self,
        config: ModelConfig,
        batch_size: int = 1,
        max_length: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_length = max_length or config.max_position_embeddings
        shape = (
            config.num_hidden_layers,
            batch_size,
            config.num_key_value_heads,
            self.max_length,
            config.head_dim,
        )  # (nl, B, nkv, Lmax, hs)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self._pending = 0  # tokens written by the forward in progress

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, nkv, T, hs) after the committed prefix; return all keys/values."""
        t = k.shape[2]
        end = self.length + t
        if end > self.max_length:
            raise ValueError(f"KV cache full: {end} > {self.max_length} positions")
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        self._pending = t
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def commit(self) -> None:
        """Make the entries of the last forward part of the prefix."""
        self.length += self._pending
        self._pending = 0

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}; cache holds {self.length}")
        self.length = length
        self._pending = 0

    def keep(self, start: int, indices: torch.Tensor) -> None:
        """Keep only entries start+indices (sorted) after position `start`, packed contiguously."""
        n = int(indices.numel())
        src = start + indices.to(self.keys.device)
        self.keys[:, :, :, start : start + n] = self.keys.index_select(3, src)
        self.values[:, :, :, start : start + n] = self.values.index_select(3, src)
        self.length = start + n
        self._pending = 0


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope_tables(config: ModelConfig, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    hs = config.head_dim
    # device="cpu": real tables even when the model is built under torch.device("meta")
    arange = torch.arange(0, hs, 2, dtype=torch.float32, device="cpu")
    inv_freq = 1.0 / (config.rope_theta ** (arange / hs))
    t = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    freqs = torch.outer(t, inv_freq)  # (Lmax, hs/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (Lmax, hs)
    return emb.cos().to(device), emb.sin().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, h, T, hs); cos/sin (B or 1, 1, T, hs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention_inputs(
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    positions: torch.Tensor,
    past: int,
    tree_mask: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """RoPE rows for `positions` and the attention mask for T new tokens after `past` cached.

    The mask is None when plain causal attention (or a single query) suffices; otherwise
    (1, 1, T, L+T) bool: every cached entry visible, new tokens per `tree_mask` (T, T)
    or causal. A `tree_mask` of shape (T, L+T) is taken as the whole mask (a draft tree
    whose earlier levels are already in the cache).
    """
    t = positions.shape[0]
    cos = rope_cos[positions][None, None].to(dtype)  # (1, 1, T, hs)
    sin = rope_sin[positions][None, None].to(dtype)
    if tree_mask is None and (past == 0 or t == 1):
        return cos, sin, None
    if tree_mask is not None and tree_mask.shape[-1] == past + t:
        return cos, sin, tree_mask[None, None]
    device = positions.device
    local = tree_mask if tree_mask is not None else torch.ones(t, t, dtype=torch.bool, device=device).tril()
    full = torch.ones(t, past + t, dtype=torch.bool, device=device)
    full[:, past:] = local
    return cos, sin, full[None, None]  # (1, 1, T, L+T)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, hs = config.hidden_size, config.head_dim
        self.n_head, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.hs = hs
        self.q_proj = nn.Linear(c, self.n_head * hs, bias=False)
        self.k_proj = nn.Linear(c, self.n_kv * hs, bias=False)
        self.v_proj = nn.Linear(c, self.n_kv * hs, bias=False)
        self.o_proj = nn.Linear(self.n_head * hs, c, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_head, self.hs).transpose(1, 2)  # (B, nh, T, hs)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hs).transpose(1, 2)  # (B, nkv, T, hs)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hs).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.append(layer, k, v)  # (B, nkv, L+T, hs)
        if self.n_kv != self.n_head:
            rep = self.n_head // self.n_kv
            k = k.repeat_interleave(rep, dim=1)  # (B, nh, L+T, hs)
            v = v.repeat_interleave(rep, dim=1)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(b, t, self.n_head * self.hs)  # (B, T, C)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(c, f, bias=False)
        self.up_proj = nn.Linear(c, f, bias=False)
        self.down_proj = nn.Linear(f, c, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, mask, cache, layer) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """`model.*` in the Hugging Face layout: embeddings, decoder layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
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
        self.register_buffer("rope_sin", sin, persistent=False)

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
        logits = self.lm_head(hidden[:, -1:] if last_only else hidden).float()  # (B, T or 1, V)
        return ForwardOutput(logits=logits, hidden=hidden)

    def new_cache(self, batch_size: int = 1, max_length: int | None = None) -> KVCache:
        w = self.lm_head.weight
        return KVCache(self.config, batch_size, max_length, dtype=w.dtype, device=w.device)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def init_weights(model: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style init; residual output projections scaled by 1/sqrt(2 * layers)."""
    layers = getattr(getattr(model, "config", None), "num_hidden_layers", 1)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            scale = 1 / math.sqrt(2 * layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1
            nn.init.normal_(p, mean=0.0, std=std * scale)


def load_config(model_dir: str | Path) -> ModelConfig:
    return ModelConfig.from_dict(json.loads((Path(model_dir) / "config.json").read_text()))


def load_model(
    model_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
) -> LlamaForCausalLM:
    """The checkpoint's tensors become the parameters, with no copy when `dtype` is the
    stored one on the CPU: the model is built on the meta device (no random init) and
    `assign=True` adopts the tensors safetensors maps from the file, so workers serving
    the same folder share its pages in the page cache."""
    from safetensors.torch import load_file

    config = load_config(model_dir)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = load_file(str(Path(model_dir) / "model.safetensors"))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"checkpoint mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:  # assign replaced embed_tokens.weight: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device=device, dtype=dtype).eval()


def save_model(model: LlamaForCausalLM, model_dir: str | Path, dtype: torch.dtype = torch.bfloat16) -> None:
    from safetensors.torch import save_file

    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(model.config.to_hf_dict(), indent=2) + "\n")
