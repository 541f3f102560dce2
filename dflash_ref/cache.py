"""Per-layer key/value cache with append, crop and length (seed: "past_key_values ... crop(start)").

For every layer l the cache holds K^(l), V^(l) of shape (B, H_kv, L_cache, d_h):

    update(K_new, V_new, l):  K^(l) ← concat[K^(l), K_new]  (along the sequence), returns the whole
    crop(n):                  K^(l) ← K^(l)[:, :, :n]       (the first n positions stay)

The loop crops the target cache to the accepted length after every verify, and the draft cache back
to `start` after every draft pass (context K/V stay, the block's K/V go). `update` has the same
signature as transformers' `Cache.update`, so the official draft module can run against it.

Storage: one buffer per layer with spare room, grown by doubling, so an append writes in place and
a crop only moves the length: no copy of the whole cache on every step. `keys[l]` / `values[l]`
are views of the valid part.
"""

from __future__ import annotations

import torch

MIN_CAPACITY = 64


class KVCache:
    def __init__(self, num_layers: int) -> None:
        if num_layers < 1:
            raise ValueError(f"a KV cache needs at least one layer, got {num_layers}")
        self._k: list[torch.Tensor | None] = [None] * num_layers  # (B, H_kv, capacity, d_h)
        self._v: list[torch.Tensor | None] = [None] * num_layers
        self._len = [0] * num_layers

    def __len__(self) -> int:
        return len(self._k)

    @property
    def keys(self) -> list[torch.Tensor | None]:
        return [None if k is None else k[:, :, :n] for k, n in zip(self._k, self._len)]

    @property
    def values(self) -> list[torch.Tensor | None]:
        return [None if v is None else v[:, :, :n] for v, n in zip(self._v, self._len)]

    def _check(self, key_states, value_states, layer_idx) -> None:
        if not 0 <= layer_idx < len(self._k):
            raise IndexError(f"layer {layer_idx} is outside this {len(self._k)}-layer cache")
        if key_states.shape != value_states.shape:
            raise ValueError(
                f"keys {tuple(key_states.shape)} and values {tuple(value_states.shape)} must have the same shape"
            )
        old = self._k[layer_idx]
        if key_states.dtype != value_states.dtype or (old is not None and old.dtype != key_states.dtype):
            raise ValueError(
                f"layer {layer_idx}: cached and new keys/values must share one dtype, got "
                f"{key_states.dtype} / {value_states.dtype}"
            )
        if old is not None and (old.shape[:2] != key_states.shape[:2] or old.shape[3] != key_states.shape[3]):
            cached = (*old.shape[:2], self._len[layer_idx], old.shape[3])
            raise ValueError(
                f"layer {layer_idx} caches {cached}; cannot append {tuple(key_states.shape)} "
                "(batch, heads and head_dim must match)"
            )

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H_kv, L_new, d_h) keys/values to layer `layer_idx`; return the whole layer."""
        self._check(key_states, value_states, layer_idx)
        n, new = self._len[layer_idx], key_states.shape[2]
        k, v = self._k[layer_idx], self._v[layer_idx]
        if k is None or k.shape[2] < n + new:  # grow: double, keep the valid part
            capacity = max(n + new, 2 * (0 if k is None else k.shape[2]), MIN_CAPACITY)
            shape = (*key_states.shape[:2], capacity, key_states.shape[3])  # (B, H_kv, capacity, d_h)
            grown_k = key_states.new_empty(shape)
            grown_v = value_states.new_empty(shape)
            if n:
                grown_k[:, :, :n], grown_v[:, :, :n] = k[:, :, :n], v[:, :, :n]
            self._k[layer_idx], self._v[layer_idx] = k, v = grown_k, grown_v
        k[:, :, n : n + new] = key_states
        v[:, :, n : n + new] = value_states
        self._len[layer_idx] = n + new
        return k[:, :, : n + new], v[:, :, : n + new]  # (B, H_kv, L_cache + L_new, d_h)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if not 0 <= layer_idx < len(self._k):
            raise IndexError(f"layer {layer_idx} is outside this {len(self._k)}-layer cache")
        return self._len[layer_idx]

    @property
    def length(self) -> int:
        return self._len[0]

    def lengths(self) -> list[int]:
        return list(self._len)

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of every layer (length ≤ current length)."""
        current = self.length
        if not 0 <= length <= current:
            raise ValueError(f"cannot crop a cache of length {current} to {length}")
        self._len = [min(n, length) for n in self._len]

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self._k)}, lengths={self.lengths()})"
