"""A hybrid target's state in mlx-lm, read in the kit's layout (for official_mlx.py).

mlx-lm's Qwen3.5 keeps one cache per layer: a KVCache (with `offset`, the length) for full attention, an
ArraysCache for Gated DeltaNet, [conv window (B, K − 1, C), recurrent state (B, H_v, d_v, d_k)].
The kit's stages are the conv window (C, K − 1) and S (H_v, d_k, d_v) (stages.py), so both are transposed.
"""

from __future__ import annotations

import numpy as np

from ..stages import key_for


def cache_length(cache) -> int:
    """The length of a target's (or draft's) cache list: the offset of its first layer that has one."""
    return next(layer.offset for layer in cache if hasattr(layer, "offset"))


def linear_states(cache, step: int, as_numpy) -> dict[str, np.ndarray]:
    """{key: array} of every Gated DeltaNet layer's conv window and S (as_numpy: mx array → numpy)."""
    out = {}
    for layer, c in enumerate(cache):
        if hasattr(c, "offset") or c[1] is None:  # attention layers; a linear layer before any token
            continue
        out[key_for("conv_state", step, layer)] = as_numpy(c[0][0]).T  # (C, K − 1)
        out[key_for("recurrent_state", step, layer)] = as_numpy(c[1][0]).transpose(0, 2, 1)  # (H_v, d_k, d_v)
    return out
