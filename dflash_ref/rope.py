"""Rotary position embedding with DFlash's sliced query (seed: "位置编码对齐").

For a position p and frequency θ_i = base^(−2i/d_h), i = 0..d_h/2 − 1:

    cos_p = cos(p · [θ, θ]),  sin_p = sin(p · [θ, θ])                         (d_h values each)
    RoPE(x)_p = x_p ⊙ cos_p + rotate_half(x_p) ⊙ sin_p,   rotate_half([a, b]) = [−b, a]

KV injection gives K length L_c + L_q and Q length L_q, so the cos/sin tables are computed for all
L_c + L_q positions (context first, then the block) and

    K uses every row:         k_embed = k ⊙ cos + rotate_half(k) ⊙ sin
    Q uses the last L_q rows: q_embed = q ⊙ cos[−L_q:] + rotate_half(q) ⊙ sin[−L_q:]

With L_c = 0 this is ordinary RoPE, which is how the target uses the same function.
Only the plain ("default") rope type is implemented; scaled variants are refused by the config.
"""
from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[a, b] → [−b, a] over the last dimension (halves, not interleaved pairs)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for given position ids; holds no parameters (nothing in the state dict)."""

    def __init__(self, head_dim: int, rope_theta: float) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.rope_theta = float(rope_theta)
        self._inv_freq: dict[torch.device, torch.Tensor] = {}  # θ_i per device, computed once

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        if device not in self._inv_freq:
            # same float32 recipe as transformers (computed on the CPU, then moved)
            exponent = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
            self._inv_freq[device] = (1.0 / (self.rope_theta ** exponent)).to(device)
        return self._inv_freq[device]

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids (B, L) → cos, sin each (B, L, d_h) in `dtype` (angles in float32)."""
        if position_ids.dim() != 2:
            raise ValueError(f"position_ids must be (batch, length), got shape {tuple(position_ids.shape)}")
        inv_freq = self.inv_freq(position_ids.device)
        freqs = position_ids[:, :, None].float() * inv_freq[None, None, :]  # (B, L, d_h/2)
        angles = torch.cat((freqs, freqs), dim=-1)                            # (B, L, d_h)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rope_theta={self.rope_theta}"


def apply_sliced_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H_q, L_q, d_h), k (B, H_kv, L_c + L_q, d_h), cos/sin (B, L_c + L_q, d_h)."""
    q_len, k_len = q.shape[-2], k.shape[-2]
    if cos.shape[-2] != k_len or q_len > k_len:
        raise ValueError(f"RoPE tables cover {cos.shape[-2]} positions but K has {k_len} and Q {q_len} "
                         "(need one position per key, Q being the last L_q of them)")
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, L_c + L_q, d_h): broadcast over heads
    q_embed = q * cos[..., -q_len:, :] + rotate_half(q) * sin[..., -q_len:, :]
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed, k_embed
