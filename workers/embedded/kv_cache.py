"""The KV cache: one sequence's keys and values for every layer of a Llama-family model.

Legend: nl layers, B batch, nkv key/value heads, T new tokens, hs head size.
"""

from __future__ import annotations

from typing import Protocol

import torch


class CacheShape(Protocol):
    """What the cache reads of a model's config (`model.ModelConfig` is one)."""

    num_hidden_layers: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int


class KVCache:
    """Keys and values for every layer, with explicit append, commit, rollback and keep.

    Positions [0, length) hold committed tokens. `append` writes new entries after them;
    `commit` makes the last forward's entries part of the prefix; `rollback(n)` forgets
    everything from position n; `keep(indices)` compacts a verified tree path so that its
    entries become contiguous after the committed prefix. Nothing else writes the storage.

    The storage grows by doubling (amortised O(1) per token) up to `max_length`, the most
    positions the cache may hold, instead of being allocated for the whole context: a
    request on an 8192-token model that stops at 300 tokens holds 512 positions.
    """

    MIN_CAPACITY = 64

    def __init__(
        self,
        config: CacheShape,
        batch_size: int = 1,
        max_length: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_length = max_length or config.max_position_embeddings
        self._shape = (
            config.num_hidden_layers,
            batch_size,
            config.num_key_value_heads,
            min(self.MIN_CAPACITY, self.max_length),
            config.head_dim,
        )  # (nl, B, nkv, capacity, hs)
        self.keys = torch.zeros(self._shape, dtype=dtype, device=device)
        self.values = torch.zeros(self._shape, dtype=dtype, device=device)
        self.length = 0
        self._pending = 0  # tokens written by the forward in progress

    @property
    def capacity(self) -> int:
        """Positions allocated now (grows on demand up to max_length)."""
        return self.keys.shape[3]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, nkv, T, hs) after the committed prefix; return all keys/values."""
        t = k.shape[2]
        end = self.length + t
        if end > self.max_length:
            raise ValueError(f"KV cache full: {end} > {self.max_length} positions")
        if end > self.capacity:
            self._grow(end)
        self.keys[layer, :, :, self.length : end] = k
        self.values[layer, :, :, self.length : end] = v
        self._pending = t
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def _grow(self, needed: int) -> None:
        """Reallocate at max(2 x capacity, needed), at most max_length; copies every layer,
        including entries another layer already wrote in the forward in progress."""
        old = self.capacity
        new = min(self.max_length, max(2 * old, needed))
        for name in ("keys", "values"):
            tensor = getattr(self, name)
            grown = tensor.new_zeros((*tensor.shape[:3], new, tensor.shape[4]))
            grown[:, :, :, :old] = tensor
            setattr(self, name, grown)

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
