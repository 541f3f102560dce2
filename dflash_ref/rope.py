"""Rotary position embedding with DFlash's sliced query (seed: "位置编码对齐"), plain or scaled.

For a position p and frequency θ_i = base^(−2i/d_h), i = 0..d_h/2 − 1:

    cos_p = m · cos(p · [θ, θ]),  sin_p = m · sin(p · [θ, θ])                 (d_h values each)
    RoPE(x)_p = x_p ⊙ cos_p + rotate_half(x_p) ⊙ sin_p,   rotate_half([a, b]) = [−b, a]

A scaled RoPE (config_fields.py reads its parameters) changes only the frequencies θ_i and the
attention factor m, which multiplies the tables (so q·k gains m²):

    plain ("default")  θ_i                                          m = 1
    linear             θ_i / s   (position p looks like p / s)      m = 1
    yarn               θ_i / s blended into θ_i by a ramp over i    m = 0.1 ln s + 1   (yarn_* below)

KV injection gives K length L_c + L_q and Q length L_q, so the cos/sin tables are computed for all
L_c + L_q positions (context first, then the block) and

    K uses every row:         k_embed = k ⊙ cos + rotate_half(k) ⊙ sin
    Q uses the last L_q rows: q_embed = q ⊙ cos[−L_q:] + rotate_half(q) ⊙ sin[−L_q:]

With L_c = 0 this is ordinary RoPE, which is how the target uses the same function. Other rope types
(dynamic, llama3, longrope, …) are refused by the config.

Every table is computed in float32 in the order transformers computes it, so that cos/sin agree with
transformers' rotary embeddings to the last bit (one ulp of θ_0 = 1 moves p · θ_0 by ~1e-2 at p ≈ 10⁵).
"""

from __future__ import annotations

import math

import torch
from torch import nn

YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[a, b] → [−b, a] over the last dimension (halves, not interleaved pairs)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def base_powers(head_dim: int, base: float) -> torch.Tensor:
    """base^(2i/d_h) for i = 0..d_h/2 − 1, float32, shape (d_h/2,): the wavelengths / 2π, θ_i = 1 / this."""
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # (d_h/2,)
    return base**exponent


def plain_inv_freq(head_dim: int, base: float) -> torch.Tensor:
    """θ_i = 1 / base^(2i/d_h), shape (d_h/2,)."""
    return 1.0 / base_powers(head_dim, base)


def linear_inv_freq(head_dim: int, base: float, factor: float) -> torch.Tensor:
    """θ_i / s: p · θ_i / s = (p / s) · θ_i, positions interpolated into the trained range."""
    return plain_inv_freq(head_dim, base) / factor


def yarn_boundary(beta: float, head_dim: int, base: float, original_max_position_embeddings: int) -> float:
    """The (fractional) index i at which frequency θ_i turns β times over the L₀ trained positions:

    L₀ · θ_i = 2π β   ⇔   i = d_h · ln(L₀ / (2π β)) / (2 ln base)
    """
    return (head_dim * math.log(original_max_position_embeddings / (beta * 2 * math.pi))) / (2 * math.log(base))


def yarn_ramp(head_dim: int, base: float, p: dict) -> torch.Tensor:
    """ramp_i = clamp((i − lo) / (hi − lo), 0, 1), shape (d_h/2,): 0 for the fast dimensions, 1 for the slow.

    lo = boundary(β_fast), hi = boundary(β_slow); with truncate, lo is floored and hi ceiled; then
    lo ≥ 0 and hi ≤ d_h − 1, and hi gets 0.001 more where lo = hi (no division by zero)."""
    lo = yarn_boundary(p["beta_fast"], head_dim, base, p["original_max_position_embeddings"])
    hi = yarn_boundary(p["beta_slow"], head_dim, base, p["original_max_position_embeddings"])
    if p["truncate"]:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, head_dim - 1)
    if lo == hi:
        hi += 0.001
    return ((torch.arange(head_dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)  # (d_h/2,)


def yarn_inv_freq(head_dim: int, base: float, p: dict) -> torch.Tensor:
    """YaRN's frequencies ("NTK-by-parts"), shape (d_h/2,):

        w_i  = 1 − ramp_i                           share of dimension i kept as trained
        θ'_i = θ_i / s · (1 − w_i) + θ_i · w_i

    Dimensions turning more than β_fast times over L₀ keep θ_i (extrapolated), those turning fewer
    than β_slow times take θ_i / s (interpolated, as linear), those in between a linear blend."""
    powers = base_powers(head_dim, base)  # (d_h/2,) base^(2i/d_h) = 1 / θ_i
    kept, squeezed = 1.0 / powers, 1.0 / (p["factor"] * powers)
    w = 1 - yarn_ramp(head_dim, base, p)
    return squeezed * (1 - w) + kept * w


def yarn_mscale(s: float, m: float = 1.0) -> float:
    """μ(s, m) = 0.1 · m · ln s + 1 for s > 1, else 1."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def yarn_attention_factor(p: dict) -> float:
    """m = attention_factor where given; else μ(s, mscale) / μ(s, mscale_all_dim) where both are given
    and non-zero (DeepSeek's form); else μ(s, 1) = 0.1 ln s + 1."""
    if p.get("attention_factor") is not None:
        return p["attention_factor"]
    s, mscale, mscale_all_dim = p["factor"], p.get("mscale"), p.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim))
    return yarn_mscale(s)


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
