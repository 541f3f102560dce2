"""A Gated DeltaNet layer (Qwen3.5's "linear_attention"), written as its recurrence.

For the token at position t, with x_t the layer input (after the pre-norm):

    u_t = W_qkv x_t                                          (C = 2·H_k·d_k + H_v·d_v channels)
    [q_t; k_t; v_t] = SiLU(Σ_{j<K} w_j ⊙ u_{t−K+1+j})        short causal depthwise conv, state W = the last K − 1 u's
    q_t ← L2(q_t) / √d_k,  k_t ← L2(k_t)                     per head, L2(x) = x / sqrt(Σ x² + 1e-6)
    g_t = −exp(A_log) · softplus(W_a x_t + dt_bias),  α_t = exp(g_t)      decay, one per value head
    β_t = sigmoid(W_b x_t)                                   write strength, one per value head
    S_t = α_t S_{t−1} + β_t k_t (v_t − α_t S_{t−1}ᵀ k_t)ᵀ     the gated delta rule, S (d_k, d_v) per head
    o_t = S_tᵀ q_t
    y_t = W_out · [w ⊙ RMSNorm(o_t) ⊙ SiLU(W_z x_t)]         gated RMSNorm per head, plain weight w

Query/key heads are shared by H_v / H_k value heads (repeated, as GQA repeats K/V). Everything after the
L2 norm runs in float32 (float64 for a float64 model), as transformers' torch fallback does; its chunked
form (used for prompts) computes the same S_t by a different route, so the two agree to rounding, not bit for bit.
Parameter names are transformers' Qwen3_5GatedDeltaNet's, so its state dict loads unchanged.
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from torch import nn
from torch.nn import functional as F

from ..hooks import HookPoint


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(Σ x² + eps) over the last dimension."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def causal_depthwise_conv(inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """SiLU of the causal depthwise conv: inputs (B, C, K − 1 + L) = [W; u_new], weight (C, 1, K) → (B, C, L)."""
    return F.silu(F.conv1d(inputs, weight, groups=inputs.shape[1]))


def decay_and_beta(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """g = −exp(A_log) · softplus(a + dt_bias) (float32), β = sigmoid(b); each (B, L, H_v)."""
    return -A_log.float().exp() * F.softplus(a.float() + dt_bias), b.sigmoid()


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    keep_states: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence, one position at a time (float32).

    q, k (B, H_v, L, d_k) (q already scaled), v (B, H_v, L, d_v), g, beta (B, H_v, L), state S_0 (B, H_v, d_k, d_v)
    → o (B, H_v, L, d_v) and S_1..S_L (B, H_v, L, d_k, d_v) if keep_states, else S_L alone (B, H_v, 1, d_k, d_v)."""
    outputs, states, S = [], [], state
    for t in range(q.shape[2]):
        S = S * g[:, :, t].exp()[..., None, None]  # α_t S_{t−1}
        recalled = (S * k[:, :, t, :, None]).sum(dim=-2)  # (α_t S_{t−1})ᵀ k_t  (B, H_v, d_v)
        delta = (v[:, :, t] - recalled) * beta[:, :, t, None]  # β_t (v_t − …)
        S = S + k[:, :, t, :, None] * delta[:, :, None, :]  # + k_t δ_tᵀ
        outputs.append((S * q[:, :, t, :, None]).sum(dim=-2))  # o_t = S_tᵀ q_t
        if keep_states:
            states.append(S)
    kept = torch.stack(states, dim=2) if keep_states else S[:, :, None]
    return torch.stack(outputs, dim=2), kept  # (B, H_v, L, d_v), (B, H_v, L | 1, d_k, d_v)


class GatedRMSNorm(nn.Module):
    """w ⊙ x / sqrt(mean(x²) + eps) ⊙ SiLU(z) over the last dimension (normed in float32; plain weight, init 1)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (normed * F.silu(z.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_k_heads, self.num_v_heads = config.linear_num_key_heads, config.linear_num_value_heads
        self.head_k_dim, self.head_v_dim = config.linear_key_head_dim, config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim  # C
        self.kernel_size = config.linear_conv_kernel_dim  # K
        d = config.hidden_size
        self.in_proj_qkv = nn.Linear(d, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(d, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(d, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim,
            self.conv_dim,
            self.kernel_size,
            groups=self.conv_dim,
            bias=False,
            padding=self.kernel_size - 1,
        )  # weight (C, 1, K); padding unused (the state pads)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))  # A = 1 until loaded
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, d, bias=False)
        self.hook_q = HookPoint()  # (B, L, H_v, d_k)  L2-normed, before the 1/√d_k scale
        self.hook_k = HookPoint()  # (B, L, H_v, d_k)  L2-normed
        self.hook_v = HookPoint()  # (B, L, H_v, d_v)
        self.hook_decay = HookPoint()  # (B, L, H_v)       g_t (α_t = exp g_t)
        self.hook_beta = HookPoint()  # (B, L, H_v)       β_t
        self.hook_output = HookPoint()  # (B, L, H_v, d_v)  o_t, before the gated norm

    def conv_window(self, cache, batch: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(W, S) at the cache length: zeros without a cache or before the first token."""
        conv, recurrent = cache.linear_state(self.layer_idx) if cache is not None else (None, None)
        if conv is None:
            conv = like.new_zeros(batch, self.conv_dim, self.kernel_size - 1)  # (B, C, K − 1)
        if recurrent is None:
            recurrent = like.new_zeros(
                batch,
                self.num_v_heads,
                self.head_k_dim,
                self.head_v_dim,
                dtype=torch.promote_types(like.dtype, torch.float32),
            )  # (B, H_v, d_k, d_v)
        return conv, recurrent

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        """x (B, L, d) → (B, L, d); with a HybridCache, reads (W, S) and records this forward's states."""
        batch, length, _ = x.shape
        window, state = self.conv_window(cache, batch, x)
        inputs = torch.cat([window.to(x.dtype), self.in_proj_qkv(x).transpose(1, 2)], dim=-1)  # (B, C, K − 1 + L)
        mixed = causal_depthwise_conv(inputs, self.conv1d.weight).transpose(1, 2)  # (B, L, C)
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        share = self.num_v_heads // self.num_k_heads
        q = repeat(q, "b l (h d) -> b l (h r) d", d=self.head_k_dim, r=share)  # (B, L, H_v, d_k)
        k = repeat(k, "b l (h d) -> b l (h r) d", d=self.head_k_dim, r=share)  # (B, L, H_v, d_k)
        v = rearrange(v, "b l (h d) -> b l h d", d=self.head_v_dim)  # (B, L, H_v, d_v)
        acc = torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for a float64 model
        q, k = self.hook_q(l2_normalize(q).to(acc)), self.hook_k(l2_normalize(k).to(acc))
        v = self.hook_v(v.to(acc))
        g, beta = decay_and_beta(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)
        g, beta = self.hook_decay(g.to(acc)), self.hook_beta(beta.to(acc))
        keep = cache is not None and cache.keeps_every_position(length)
        heads_first = lambda t: rearrange(t, "b l h ... -> b h l ...")  # noqa: E731  (B, H_v, L, …)
        out, states = gated_delta_rule(
            heads_first(q) * self.head_k_dim**-0.5,
            heads_first(k),
            heads_first(v),
            heads_first(g),
            heads_first(beta),
            state,
            keep_states=keep,
        )
        if cache is not None:
            cache.update_linear(self.layer_idx, inputs, states, length)
        out = self.hook_output(rearrange(out, "b h l d -> b l h d").to(x.dtype))  # (B, L, H_v, d_v)
        z = rearrange(self.in_proj_z(x), "b l (h d) -> b l h d", d=self.head_v_dim)  # (B, L, H_v, d_v)
        return self.out_proj(rearrange(self.norm(out, z), "b l h d -> b l (h d)"))  # (B, L, d)
