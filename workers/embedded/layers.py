"""The Llama blocks' small parts, and the weight layouts the inference path reads.

The token embedding; RMSNorm; RoPE tables and their application; the attention mask of a forward; fused
projection weights (`fuse_linears`) and their inference copies (`InferenceWeight`):
oneDNN-packed float32 (`pack`, `linear`) and 4-bit codes (`int4_codes`, `int4_linear`).

Legend: B batch, T new tokens, L cached tokens, hs head size, C hidden size.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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


class Embedding(nn.Embedding):
    """`nn.Embedding` that leaves a weight on the meta device uninitialised (the loader
    builds the model there and adopts the checkpoint's tensors). torch's meta `normal_`
    is a Python reference (`torch._refs.normal_`) whose first call imports
    `torch._dynamo` and sympy: 68 MB of private memory in every worker, never used."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


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
    GEMM does, which makes a multi-row product faster than `F.linear`; one row is
    slower, so one-row products stay on the plain weight (measured: docs/PERFORMANCE.md,
    docs/WORKER.md "The decode step").
    vLLM CPU packs every linear the same way: `dispatch_cpu_unquantized_gemm` in
    vllm/model_executor/layers/utils.py (0.32) builds `create_onednn_mm(weight.t(), 32)`.
    The copies are private memory (538 MB per float32 SmolLM2 worker; beside 4-bit layers
    only the LM head's, 113 MB); SPECROUTE_PACKED_WEIGHTS=0 turns them off (a stack of
    many workers on little memory; multi-row head products are then slower)."""
    if (os.environ.get("SPECROUTE_PACKED_WEIGHTS", "1") == "0" or weight.device.type != "cpu" or weight.dtype != torch.float32
            or not torch.backends.mkldnn.is_available()
            or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)


def linear(x: torch.Tensor, packed: PackedWeight) -> torch.Tensor:
    """x (..., C) @ W.T through W's packed copy."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


# 4-bit weights: torch's CPU kernel for weight-only int4 products (gpt-fast's int4 path)
# takes codes q in 0..15 per group of INT4_GROUP inputs with a bf16 scale and zero per
# (group, output): w = (q - 8) * scale + zero, and bf16 inputs. A Q4_1 checkpoint
# (llama.cpp: per block of 32, w = d * q + m, q in 0..15) is exactly that with
# scale = d, zero = m + 8 d, so serving its codes is serving the checkpoint, not a new
# quantization; only d and m, stored in fp16, are rounded to bf16 (~0.4%).
INT4_GROUP = 32


@dataclass(frozen=True, slots=True)
class Int4Weight:
    packed: torch.Tensor  # torch's int4 CPU layout of the (N, C) codes
    scales_zeros: torch.Tensor  # (C / INT4_GROUP, N, 2) bf16: scale, zero per group


def int4_codes(weight: torch.Tensor) -> Int4Weight | None:
    """The weight's 4-bit codes when each group of INT4_GROUP inputs of every row holds
    at most 16 values evenly spaced from its minimum to its maximum — a Q4_1 checkpoint
    dequantized (llama.cpp's quantize_row_q4_1 sets m = min, d = (max - min) / 15, so the
    minimum gets 0 and the maximum 15) — and None for any other weight: quantizing those
    would change the model. Off with SPECROUTE_INT4_WEIGHTS=0, off autograd's tensors."""
    n, c = weight.shape
    if (os.environ.get("SPECROUTE_INT4_WEIGHTS", "1") == "0" or weight.device.type != "cpu"
            or c % INT4_GROUP or not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")):
        return None
    groups = weight.detach().float().reshape(n, c // INT4_GROUP, INT4_GROUP)  # (N, G, 32)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (high - low) / 15  # (N, G, 1)
    step = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = ((groups - low) / step).round().clamp(0, 15)
    off_grid = (codes * scale + low - groups).abs() > 1e-3 * step + 1e-7
    if bool(off_grid.any()):
        return None
    zeros = low + 8 * scale
    scales_zeros = torch.cat([scale, zeros], dim=-1).transpose(0, 1)  # (G, N, 2)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
        codes.reshape(n, c).to(torch.int32).contiguous(), 1)
    return Int4Weight(packed, scales_zeros.to(torch.bfloat16).contiguous())


def int4_linear(x: torch.Tensor, weight: Int4Weight) -> torch.Tensor:
    """x (..., C) @ W.T through W's 4-bit codes, in x's dtype (the product in bf16)."""
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # (M, C)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, weight.packed, INT4_GROUP,
                                                   weight.scales_zeros)  # (M, N)
    return y.view(*x.shape[:-1], y.shape[-1]).to(x.dtype)


class Int8Linear(nn.Module):
    """A drafter's `nn.Linear` run on int8 weight-only codes (one scale per output row,
    symmetric): `aten._weight_int8pack_mm` in bf16. Drafter-sized products (the EAGLE
    head's six: fc, q/k/v, o, gate/up, down, its 8,192-row draft vocabulary) run several
    times faster than in bf16 or float32, at one row and at four (one thread; figures:
    docs/WORKER.md, "The decode step"). Only drafters get it: their precision moves which
    tokens are drafted, never the output, which verification by the target decides.
    Inference only: the weight is dropped (its codes replace it; an empty `weight` of its
    dtype and device still answers what a drafter asks of it), 30 MB of bf16 weights a
    SmolLM2 worker."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127  # (N,)
        codes = (w / scales[:, None]).round().clamp(-127, 127).to(torch.int8)  # (N, C)
        self.register_buffer("codes", codes, persistent=False)
        self.register_buffer("scales", scales.to(torch.bfloat16), persistent=False)
        self.weight = nn.Parameter(linear.weight.new_empty(0), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("an int8 drafter is for inference (torch.inference_mode)")
        rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)  # (M, C)
        y = torch.ops.aten._weight_int8pack_mm(rows, self.codes, self.scales)  # (M, N)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], y.shape[-1]).to(self.weight.dtype)


def int8_linears(module: nn.Module) -> nn.Module:
    """Every `nn.Linear` inside `module` (a drafter) swapped for its `Int8Linear`, in
    place; unchanged where torch has no int8 kernel, off the CPU, or with
    SPECROUTE_INT8_DRAFTERS=0."""
    if (os.environ.get("SPECROUTE_INT8_DRAFTERS", "1") == "0"
            or not hasattr(torch.ops.aten, "_weight_int8pack_mm")):
        return module
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.weight.device.type == "cpu":
                setattr(parent, name, Int8Linear(child))
    return module


class InferenceWeight:
    """The inference copy of one (possibly fused) weight (N, C). A 4-bit weight
    (`int4_codes`) runs every product on its codes; another weight runs products of more
    than one row on its oneDNN-packed float32 copy (`pack`), and one row on the
    parameters. One kind of product for every row count keeps a 4-bit model's outputs the
    same whether a token is decoded alone, verified among drafts or batched with a prefill
    (bf16-rounded outputs would otherwise differ between kinds, and greedy speculative
    output drift from plain). On SmolLM2's layer linears int4 is much faster than packed
    float32 at the rows of decode and verify, and slower only at prefill's many rows
    (figures: docs/WORKER.md, "The decode step"). `serves(rows)` says whether a product
    of that many rows has a copy."""

    __slots__ = ("int4", "packed")

    def __init__(self, weight: torch.Tensor) -> None:
        self.int4 = int4_codes(weight)
        self.packed = pack(weight) if self.int4 is None else None

    def serves(self, rows: int) -> bool:
        return self.int4 is not None or (self.packed is not None and rows > 1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., C) @ W.T; only for a row count this weight `serves`."""
        if self.int4 is not None:
            return int4_linear(x, self.int4)
        assert self.packed is not None
        return linear(x, self.packed)


def unread_weights(copies: tuple[InferenceWeight, ...] | None,
                   sources: tuple[tuple[nn.Linear, ...], ...]) -> list[torch.Tensor]:
    """The weights of the linears each copy was made from, where the copy is 4-bit codes:
    those serve products of every row count, so with autograd off nothing reads the
    float32 weights again (`checkpoint.load_model` hands their mapped pages back)."""
    if copies is None:
        return []
    return [linear.weight for copy, group in zip(copies, sources, strict=True)
            if copy.int4 is not None for linear in group]
