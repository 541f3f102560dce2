"""Per-layer key/value cache with append, crop and length (seed: "past_key_values ... crop(start)").

For every layer l the cache holds K^(l), V^(l) of shape (B, H_kv, L_cache, d_h):

    update(K_new, V_new, l):  K^(l) ← concat[K^(l), K_new]  (along the sequence), returns the whole
    crop(n):                  K^(l) ← K^(l)[:, :, :n]       (the first n positions stay)

The loop crops the target cache to the accepted length after every verify, and the draft cache back
to `start` after every draft pass (context K/V stay, the block's K/V go). `update` has the same
signature as transformers' `Cache.update`, so the official draft module can run against it.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int) -> None:
        if num_layers < 1:
            raise ValueError(f"a KV cache needs at least one layer, got {num_layers}")
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def __len__(self) -> int:
        return len(self.keys)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H_kv, L_new, d_h) keys/values to layer `layer_idx`; return the whole layer."""
        if not 0 <= layer_idx < len(self.keys):
            raise IndexError(f"layer {layer_idx} is outside this {len(self.keys)}-layer cache")
        if key_states.dtype != value_states.dtype or (
                self.keys[layer_idx] is not None and self.keys[layer_idx].dtype != key_states.dtype):
            raise ValueError(f"layer {layer_idx}: cached and new keys/values must share one dtype, got "
                             f"{key_states.dtype} / {value_states.dtype}")
        if key_states.shape != value_states.shape:
            raise ValueError(f"keys {tuple(key_states.shape)} and values {tuple(value_states.shape)} "
                             "must have the same shape")
        old_k, old_v = self.keys[layer_idx], self.values[layer_idx]
        if old_k is not None:
            if old_k.shape[:2] != key_states.shape[:2] or old_k.shape[3] != key_states.shape[3]:
                raise ValueError(f"layer {layer_idx} caches {tuple(old_k.shape)}; cannot append "
                                 f"{tuple(key_states.shape)} (batch, heads and head_dim must match)")
            key_states = torch.cat([old_k, key_states], dim=-2)      # (B, H_kv, L_cache + L_new, d_h)
            value_states = torch.cat([old_v, value_states], dim=-2)
        self.keys[layer_idx], self.values[layer_idx] = key_states, value_states
        return key_states, value_states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        if not 0 <= layer_idx < len(self.keys):
            raise IndexError(f"layer {layer_idx} is outside this {len(self.keys)}-layer cache")
        k = self.keys[layer_idx]
        return 0 if k is None else k.shape[-2]

    @property
    def length(self) -> int:
        return self.get_seq_length(0)

    def lengths(self) -> list[int]:
        return [self.get_seq_length(i) for i in range(len(self.keys))]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of every layer (length ≤ current length)."""
        current = self.length
        if not 0 <= length <= current:
            raise ValueError(f"cannot crop a cache of length {current} to {length}")
        for i, k in enumerate(self.keys):
            if k is not None:
                self.keys[i] = k[:, :, :length]                       # (B, H_kv, length, d_h)
                self.values[i] = self.values[i][:, :, :length]

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.keys)}, lengths={self.lengths()})"
