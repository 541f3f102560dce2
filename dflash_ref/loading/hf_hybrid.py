"""transformers' own Qwen3.5 and Qwen3-Next hybrids through HFTarget, rolled back exactly by snapshot + replay.

A Gated DeltaNet layer's state (conv window W, recurrent S) cannot be cut back by slicing (hf_guard.py). For
these models HFTarget's cache instead does what the official MLX backend does:

    before a forward of L tokens at length n:   snapshot (W_n, S_n) of every linear layer, keep the L tokens
    crop(n + m), 0 ≤ m < L:                      restore (W_n, S_n), cut every K/V to n, and run the m
                                                 accepted tokens through the model again → (W_{n+m}, S_{n+m})
                                                 and K/V as a plain forward of them gives (to rounding)

The cost is that second forward of τ + 1 tokens on every step with a rejection (bench/hybrid_rollback.py times
it on the own target, which keeps per-position states instead: target/hybrid_cache.py; `bench rollback`
measures both, figures/bench/README.md). Only models whose cache is known (linear-attention layers of one
state, plus at least one full-attention layer, which transformers needs for the cache length) are taken; every
other recurrent model stays refused.
"""

from __future__ import annotations

import torch
from torch import nn

REPLAYABLE = ("Qwen3_5ForCausalLM", "Qwen3NextForCausalLM")  # tested (tests/test_hybrid_target.py); others refused


def replayable(model: nn.Module) -> bool:
    """Whether ReplayCache rolls this model back exactly: a known Gated DeltaNet hybrid with ≥ 1 attention layer."""
    types = list(getattr(model.config, "layer_types", None) or [])
    return (
        type(model).__name__ in REPLAYABLE
        and "full_attention" in types
        and set(types) <= {"linear_attention", "full_attention"}
        and getattr(model.config, "number_of_conv_states", 1) == 1
    )


class ReplayCache:
    """A transformers DynamicCache plus the snapshot of the last forward (HFTarget.forward calls record)."""

    def __init__(self, model: nn.Module) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import LinearAttentionCacheLayerMixin

        self.model = model
        self.cache = DynamicCache(config=model.config)  # conv windows stay K wide: no past recording
        self._linear = [
            i for i, layer in enumerate(self.cache.layers) if isinstance(layer, LinearAttentionCacheLayerMixin)
        ]
        self._snapshot = None  # (n, {layer: (W_n, S_n) or None before any token}, input_ids, position_ids)

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length()

    def record(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> None:
        """Before a forward: keep (W_n, S_n) of every linear layer and the tokens about to run."""
        states = {}
        for i in self._linear:
            layer = self.cache.layers[i]
            seen = layer.has_previous_state[0] and layer.is_recurrent_states_initialized[0]
            states[i] = (layer.conv_states[0].clone(), layer.recurrent_states[0].clone()) if seen else None
        self._snapshot = (self.get_seq_length(), states, input_ids, position_ids)

    def crop(self, length: int) -> None:
        """Back to the first `length` positions; inside the last forward: restore its snapshot, replay."""
        current = self.get_seq_length()
        if not 0 <= length <= current:
            raise ValueError(f"cannot crop a cache of length {current} to {length}")
        if length == current:
            return
        if self._snapshot is None or length < self._snapshot[0]:
            start = None if self._snapshot is None else self._snapshot[0]
            raise ValueError(
                f"cannot crop to {length}: a hybrid's linear-attention states roll back only within "
                f"the last forward (from {start})"
            )
        start, states, input_ids, position_ids = self._snapshot
        for i, saved in states.items():
            layer = self.cache.layers[i]
            if saved is None:
                layer.reset()  # before any token: zeros, no history
            else:
                layer.conv_states[0], layer.recurrent_states[0] = saved
        for i, layer in enumerate(self.cache.layers):
            if i not in states and current > start:
                layer.crop(start - current)  # K/V back to n (a negative count)
        self._snapshot = None
        accepted = length - start
        if accepted:
            positions = None if position_ids is None else position_ids[:, :accepted]
            with torch.no_grad():
                self.model(
                    input_ids[:, :accepted],
                    position_ids=positions,
                    past_key_values=self.cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
