"""The cache of a hybrid target (Gated DeltaNet + attention) that rolls back exactly after a verify.

Attention layers keep K^(l), V^(l) as cache.py does: crop(n) keeps the first n positions. A linear
(Gated DeltaNet) layer keeps, after the committed prefix x_1..x_n, only its state:

    conv window  W_n = [u_{n−K+2}, …, u_n]   (B, C, K − 1)        the conv's last K − 1 inputs (0 before 1)
    recurrent    S_n                         (B, H_v, d_k, d_v)   S_n = α_n S_{n−1} + β_n k_n (v_n − α_n S_{n−1}ᵀ k_n)ᵀ

S_n folds every token in, so it cannot be cut back by slicing (transformers' DynamicCache.crop trims the
conv window and leaves S with the rejected tokens in: the guard in hf_guard.py refuses those
models). Here a forward over L new positions keeps, per linear layer, what the recurrence computes anyway:

    the conv inputs  [W_n ; u_{n+1}, …, u_{n+L}]    (B, C, K − 1 + L)
    S_{n+1}, …, S_{n+L}                              (B, H_v, L, d_k, d_v)

and crop(m), n ≤ m ≤ n + L, picks W_m = inputs[..., m − n : m − n + K − 1] and S_m (S_n when m = n):
exact (the very numbers the forward computed), no replay. The loop only crops within its last verify.

Why not snapshot + replay (keep S_n, W_n; on crop run the τ + 1 accepted tokens through the target again,
as the official MLX backend does)? Replay is a second target forward on every step with a rejection, the
whole network for τ + 1 tokens; keeping states is a copy of H_v·d_k·d_v floats per position and linear
layer (`python -m dflash_ref bench rollback` measures both, figures/bench/README.md). The memory of L
states is only held for the last forward: forwards longer than `keep_positions` (a long prefill) keep
S_{n+L} alone, and a crop into them is refused with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cache import KVCache

KEEP_POSITIONS = 64  # forwards up to this many tokens keep every position's state (verifies do)


@dataclass
class LinearLayerState:
    """One Gated DeltaNet layer: its state at `length`, and the last forward's, not yet committed."""

    length: int = 0
    conv: torch.Tensor | None = None  # W_length (B, C, K − 1); None: all zeros (nothing seen)
    recurrent: torch.Tensor | None = None  # S_length (B, H_v, d_k, d_v); None: zeros
    inputs: torch.Tensor | None = None  # pending [W_length ; u_new] (B, C, K − 1 + L)
    states: torch.Tensor | None = None  # pending S per new position (B, H_v, L, d_k, d_v), or the last (…, 1, …)
    pending: int = 0  # L

    def pick(self, m: int, keep_positions: int) -> None:
        """Commit the first m of the pending L positions (0 ≤ m ≤ L): W and S after them."""
        if m == 0:
            self.inputs = self.states = None
            self.pending = 0
            return
        if m < self.pending and self.states.shape[2] != self.pending:
            raise ValueError(
                f"cannot roll a linear-attention layer back into a forward of {self.pending} tokens: "
                f"only forwards of ≤ {keep_positions} tokens keep a state per position "
                "(HybridCache(keep_positions=...))"
            )
        window = self.inputs.shape[-1] - self.pending  # K − 1
        self.conv = self.inputs[..., m : m + window].clone()  # (B, C, K − 1)
        self.recurrent = self.states[:, :, m - 1 if self.states.shape[2] > 1 else 0].clone()  # (B, H_v, d_k, d_v)
        self.length += m
        self.inputs = self.states = None
        self.pending = 0


class HybridCache:
    """KV for the "full_attention" layers, exact rollback states for the "linear_attention" ones."""

    def __init__(self, layer_types: list[str], keep_positions: int = KEEP_POSITIONS) -> None:
        unknown = sorted({t for t in layer_types if t not in ("linear_attention", "full_attention")})
        if unknown or not layer_types:
            raise ValueError(
                f"a hybrid cache needs layer types 'linear_attention' / 'full_attention', got {unknown or 'no layers'}"
            )
        if isinstance(keep_positions, bool) or not isinstance(keep_positions, int) or keep_positions < 1:
            raise ValueError(f"keep_positions must be an integer ≥ 1, got {keep_positions!r}")
        self.layer_types, self.keep_positions = list(layer_types), keep_positions
        attention = [i for i, t in enumerate(layer_types) if t == "full_attention"]
        self._slot = {layer: slot for slot, layer in enumerate(attention)}  # layer index → KV slot
        self.kv = KVCache(len(attention)) if attention else None
        self.linear = {i: LinearLayerState() for i, t in enumerate(layer_types) if t == "linear_attention"}

    def __len__(self) -> int:
        return len(self.layer_types)

    def _linear(self, layer_idx: int) -> LinearLayerState:
        if layer_idx not in self.linear:
            raise ValueError(
                f"layer {layer_idx} is not a linear-attention layer of this cache "
                f"({self.layer_types[layer_idx] if 0 <= layer_idx < len(self) else 'out of range'})"
            )
        return self.linear[layer_idx]

    # -- attention layers: the KVCache interface ------------------------------------------------
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, H_kv, L_new, d_h) keys/values to attention layer `layer_idx`; return the whole layer."""
        if layer_idx not in self._slot:
            raise ValueError(f"layer {layer_idx} is not a full-attention layer of this cache")
        return self.kv.update(key_states, value_states, self._slot[layer_idx])

    # -- linear layers ------------------------------------------------------------------------------
    def linear_state(self, layer_idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(W, S) of layer `layer_idx` at the cache length (a pending forward is committed whole first)."""
        state = self._linear(layer_idx)
        if state.pending:
            state.pick(state.pending, self.keep_positions)
        return state.conv, state.recurrent

    def keeps_every_position(self, new_tokens: int) -> bool:
        """Whether a forward of `new_tokens` keeps one state per position (else only the last)."""
        return new_tokens <= self.keep_positions

    def update_linear(self, layer_idx: int, inputs: torch.Tensor, states: torch.Tensor, new_tokens: int) -> None:
        """Record a forward of `new_tokens`: inputs (B, C, K − 1 + L), states (B, H_v, L or 1, d_k, d_v)."""
        state = self._linear(layer_idx)
        if state.pending:
            raise ValueError(f"layer {layer_idx}: linear_state must be read before a new forward is recorded")
        if states.shape[2] not in (1, new_tokens):
            raise ValueError(f"layer {layer_idx}: {states.shape[2]} states for a forward of {new_tokens} tokens")
        state.inputs, state.states, state.pending = inputs, states, new_tokens

    # -- the loop's interface --------------------------------------------------------------------
    def layer_length(self, layer_idx: int) -> int:
        if layer_idx in self._slot:
            return self.kv.get_seq_length(self._slot[layer_idx])
        state = self._linear(layer_idx)
        return state.length + state.pending

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layer_length(layer_idx)

    def lengths(self) -> list[int]:
        return [self.layer_length(i) for i in range(len(self))]

    def crop(self, length: int) -> None:
        """Keep the first `length` positions: K/V sliced; linear layers take their state at `length`,
        which must lie within their last forward (the loop crops only after a verify)."""
        current = self.get_seq_length()
        if not 0 <= length <= current:
            raise ValueError(f"cannot crop a cache of length {current} to {length}")
        for layer_idx, state in self.linear.items():
            if not state.length <= length <= state.length + state.pending:
                raise ValueError(
                    f"cannot crop linear-attention layer {layer_idx} to {length}: its state can "
                    f"only be rolled back within its last forward ({state.length} … "
                    f"{state.length + state.pending})"
                )
            if state.length < length < state.length + state.pending and state.states.shape[2] != state.pending:
                raise ValueError(
                    f"cannot crop linear-attention layer {layer_idx} to {length}: its last forward "
                    f"({state.pending} tokens > keep_positions {self.keep_positions}) kept only "
                    "its final state"
                )
        for state in self.linear.values():
            state.pick(length - state.length, self.keep_positions)
        if self.kv is not None:
            self.kv.crop(length)

    def __repr__(self) -> str:
        return f"HybridCache(layers={len(self)}, lengths={self.lengths()})"
