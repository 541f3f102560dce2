"""Rotary position embedding with DFlash's sliced query (seed: "位置编码对齐").

KV injection gives K length L_c + L_q (context first, then the block) and Q length L_q, so the cos/sin
tables are computed for all L_c + L_q positions and

    K uses every row:         k_embed = k ⊙ cos + rotate_half(k) ⊙ sin
    Q uses the last L_q rows: q_embed = q ⊙ cos[−L_q:] + rotate_half(q) ⊙ sin[−L_q:]

where, for a position p and frequency θ_i = base^(−2i/d_h), i = 0..d_h/2 − 1,

    cos_p = m · cos(p · [θ, θ]),  sin_p = m · sin(p · [θ, θ])                 (d_h values each)
    rotate_half([a, b]) = [−b, a]

With L_c = 0 this is ordinary RoPE, which is how the targets use the same function. A scaled RoPE
changes only the frequencies θ_i and the attention factor m (m = 1 unscaled): linear and YaRN, in
rope_scaling.py; config_fields.py reads them from either spelling of a config. Other rope types
(dynamic, llama3, longrope, …) are refused by the config.

Every table is computed in float32 in the order transformers computes it, so that cos/sin agree with
transformers' rotary embeddings to the last bit (one ulp of θ_0 = 1 moves p · θ_0 by ~1e-2 at p ≈ 10⁵).
"""

from __future__ import annotations

import torch
from torch import nn

from .rope_scaling import YARN_KEYS, linear_inv_freq, plain_inv_freq, yarn_attention_factor, yarn_inv_freq


def apply_sliced_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H_q, L_q, d_h), k (B, H_kv, L_c + L_q, d_h), cos/sin (B, L_c + L_q, d_h)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    if cos.shape[-2] != k_len or q_len > k_len:
        raise ValueError(
            f"RoPE tables cover {cos.shape[-2]} positions but K has {k_len} and Q {q_len} "
            "(need one position per key, Q being the last L_q of them)"
        )
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, L_c + L_q, d_h): broadcast over heads
    q_embed = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed, k_embed


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[a, b] → [−b, a] over the last dimension (halves, not interleaved pairs)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for given position ids; holds no parameters (nothing in the state dict).

    scaling: None for plain RoPE, else the normalised parameters of Qwen3Config.rope_scaling
    (config_fields.normalise_scaling), e.g. {"rope_type": "linear", "factor": 4.0}."""

    def __init__(self, head_dim: int, rope_theta: float, scaling: dict | None = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.rope_theta = float(rope_theta)
        self.scaling = dict(scaling) if scaling else None
        kind, needs = self.rope_type, {"default": (), "linear": ("factor",), "yarn": YARN_KEYS}
        if kind not in needs:
            raise ValueError(f"rope type {kind!r} is not implemented (default, linear and yarn are)")
        if any(k not in self.scaling for k in needs[kind]):
            raise ValueError(
                f"{kind} scaling needs {needs[kind]}, got {self.scaling}: pass it through "
                "config_fields.normalise_scaling (Qwen3Config.rope_scaling is)"
            )
        self.attention_scaling = yarn_attention_factor(self.scaling) if kind == "yarn" else 1.0  # m
        self._inv_freq: dict[torch.device, torch.Tensor] = {}  # θ_i per device, computed once

    @property
    def rope_type(self) -> str:
        return self.scaling["rope_type"] if self.scaling else "default"

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """θ_i (plain), θ_i / s (linear) or θ'_i (yarn), shape (d_h/2,), computed on the CPU, then moved."""
        if device not in self._inv_freq:
            d, base, kind = self.head_dim, self.rope_theta, self.rope_type
            inv_freq = (
                linear_inv_freq(d, base, self.scaling["factor"])
                if kind == "linear"
                else yarn_inv_freq(d, base, self.scaling)
                if kind == "yarn"
                else plain_inv_freq(d, base)
            )
            self._inv_freq[device] = inv_freq.to(device)
        return self._inv_freq[device]

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B, L) → m · cos, m · sin each (B, L, d_h) in `dtype` (angles in float32)."""
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids must be (batch, length), got shape {tuple(position_ids.shape)}")
        inv_freq = self.inv_freq(position_ids.device)
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # (B, L, d_h/2)
        angles = torch.cat((freqs, freqs), dim=-1)  # (B, L, d_h)
        m = self.attention_scaling
        return (angles.cos() * m).to(dtype), (angles.sin() * m).to(dtype)

    def extra_repr(self) -> str:
        scaled = "".join(f", {k}={v}" for k, v in (self.scaling or {}).items())
        return f"head_dim={self.head_dim}, rope_theta={self.rope_theta}{scaled}"
