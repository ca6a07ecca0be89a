"""The Llama blocks' small parts, and the weight layouts the inference path reads.

RMSNorm; RoPE tables and their application; the attention mask of a forward; fused
projection weights (`fuse_linears`) and their oneDNN-packed copies (`pack`, `linear`).

Legend: B batch, T new tokens, L cached tokens, hs head size, C hidden size.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class RopeShape(Protocol):
    """What the RoPE tables read of a model's config (`model.ModelConfig` is one)."""

    head_dim: int
    rope_theta: float
    max_position_embeddings: int

PackedWeight = torch.Tensor  # a weight in oneDNN's blocked layout (torch._mkldnn)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused op
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope_tables(config: RopeShape, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    hs = config.head_dim
    # device="cpu": real tables even when the model is built under torch.device("meta")
    arange = torch.arange(0, hs, 2, dtype=torch.float32, device="cpu")
    inv_freq = 1.0 / (config.rope_theta ** (arange / hs))
    t = torch.arange(config.max_position_embeddings, dtype=torch.float32, device="cpu")
    freqs = torch.outer(t, inv_freq)  # (Lmax, hs/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (Lmax, hs)
    return emb.cos().to(device), emb.sin().to(device)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE in three ops: x * cos + roll(x, hs/2) * signed_sin.

    x (..., hs); cos, signed_sin broadcast against it; signed_sin is the sine table with
    its first half negated (`signed`), so roll(x) * signed_sin = cat(-x2, x1) * sin, the
    Hugging Face rotate_half term, exactly (a sign flip is exact)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def signed(sin: torch.Tensor) -> torch.Tensor:
    """Sine rows (..., hs) with the first half negated: the table `apply_rope` reads."""
    half = sin.shape[-1] // 2
    return torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def attention_inputs(
    rope_cos: torch.Tensor,
    rope_sin: torch.Tensor,
    positions: torch.Tensor,
    past: int,
    tree_mask: torch.Tensor | None,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """RoPE rows for `positions` (of the tables as the model holds them: cos, signed sin)
    and the attention mask for T new tokens after `past` cached.

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


def fuse_linears(*linears: nn.Linear) -> torch.Tensor:
    """One (sum of N_i) x C weight whose rows are the given bias-free linears' weights."""
    return torch.cat([lin.weight.detach() for lin in linears])


def pack(weight: torch.Tensor) -> PackedWeight | None:
    """A oneDNN-packed copy of a float32 CPU weight (N, C), or None where oneDNN is not
    there. Multiplying by it skips the per-call repacking of the weight that a plain
    GEMM does, which on this CPU (AMD EPYC, AVX2, no AVX-512) makes a 4-row product of
    SmolLM2's linears ~1.45x faster than `F.linear`; one row is ~1.25x slower, so one-row
    products stay on the plain weight (measured: docs/WORKER.md, "The decode step").
    vLLM CPU packs every linear the same way: `dispatch_cpu_unquantized_gemm` in
    vllm/model_executor/layers/utils.py (0.32) builds `create_onednn_mm(weight.t(), 32)`.
    The copies are private memory (538 MB per SmolLM2 worker); SPECROUTE_PACKED_WEIGHTS=0
    turns them off (a stack of many workers on little memory)."""
    if (os.environ.get("SPECROUTE_PACKED_WEIGHTS", "1") == "0" or weight.device.type != "cpu" or weight.dtype != torch.float32
            or not torch.backends.mkldnn.is_available()
            or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def pack_all(first: torch.Tensor, second: torch.Tensor) -> tuple[PackedWeight, PackedWeight] | None:
    """Packed copies of both weights, or None if they cannot be packed."""
    a, b = pack(first), pack(second)
    return None if a is None or b is None else (a, b)


def linear(x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
    """x (..., C) @ W.T through W's packed copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
