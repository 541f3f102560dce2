"""Scaled RoPE: the frequencies θ_i and the attention factor m that rope.py's tables use.

A scaled RoPE changes only θ_i and m, which multiplies the cos/sin tables (so q·k gains m²):

    plain ("default")  θ_i = base^(−2i/d_h)                         m = 1
    linear             θ_i / s   (position p looks like p / s)      m = 1
    yarn               θ_i / s blended into θ_i by a ramp over i    m = 0.1 ln s + 1   (yarn_* below)

The parameters come normalised from either spelling of a config (top-level `rope_scaling`, or
transformers 5's `rope_parameters`: config_fields.normalise_scaling). Everything is float32, in the
order transformers computes it.
"""

from __future__ import annotations

import math

import torch

YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "truncate")


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
