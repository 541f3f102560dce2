"""KV-injection attention, the core of DFlash (seed: "KV Injection 注意力").

With the block's hidden states H (B, L_q, d) and the projected context C (B, L_c, d):

    Q = QNorm(H W_Q)                                    (B, H_q,  L_q,       d_h)
    K = KNorm(concat[C W_K, H W_K])   = [k_ctx; k_noise] (B, H_kv, L_c + L_q, d_h)
    V =       concat[C W_V, H W_V]                       (B, H_kv, L_c + L_q, d_h)
    Attn(Q, K, V) = softmax(Q Kᵀ / √d_h) V              (non-causal: a block position sees all keys)

then RoPE with the sliced Q (`rope.py`), the draft KV cache (earlier context K/V are prepended), and
W_O. QNorm / KNorm are RMSNorms over each head's d_h features. GQA: query head h reads KV head
⌊h / (H_q / H_kv)⌋. A sliding-window layer (official rule) is causal unless `is_causal` says
otherwise; its window W means one of three things (`position_rule`, config `window_kind`):

    causal      k ≤ q and q − k < W, over every key                    (layer_types, dflash 0.1.0)
    symmetric   |q − k| < W, over every key                            (is_causal false; flash path)
    rotating    context keys with q − k < W, every block key (k ≤ q if causal): the window bounds
                only a context cache that evicts old positions          (the official MLX backend)

# diff with official: the official PyTorch code knows the causal and the symmetric readings alone (by
# is_causal); the rotating one, and naming either (`sliding_window_kind`), serve the conformance kit, whose
# bundles hold each reading ports use.

`attend` is the shared kernel: an explicit math path that returns the weights (used whenever a hook
on the scores or pattern is active) and an SDPA path for speed; the target's causal attention uses
it too.
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from torch import nn
from torch.nn import functional as F

from .cache import KVCache
from .config import DraftConfig
from .hooks import HookPoint
from .rmsnorm import RMSNorm
from .rope import apply_sliced_rope


def visibility_mask(
    q_len: int, k_len: int, *, is_causal: bool, sliding_window: int | None, device: torch.device, rotating: bool = False
) -> torch.Tensor | None:
    """Bool (L_q, L_k), True where query i may see key j; queries are the last L_q key positions
    (the block, after the context). None means everything is visible."""
    return position_rule(
        torch.arange(k_len - q_len, k_len, device=device),
        torch.arange(k_len, device=device),
        is_causal=is_causal,
        sliding_window=sliding_window,
        block_start=torch.full((q_len,), k_len - q_len, device=device) if rotating else None,
    )


def position_rule(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    *,
    is_causal: bool,
    sliding_window: int | None,
    block_start: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """A layer's own rule on positions: bool (L_q, L_k) from q_pos (L_q,) and k_pos (L_k,); None
    means everything is visible. Training narrows its block mask by it (training.block_masks).

    block_start (L_q,), each query's block start s, makes the window rotating: it bounds only the
    context keys (k < s), the block's own keys being visible by the causal rule alone."""
    if not is_causal and sliding_window is None:
        return None
    q_pos, k_pos = q_pos[:, None], k_pos[None, :]  # (L_q, 1), (1, L_k)
    visible = torch.ones(q_pos.shape[0], k_pos.shape[1], dtype=torch.bool, device=q_pos.device)
    if is_causal:
        visible &= k_pos <= q_pos
    if sliding_window is not None:
        in_window = (q_pos - k_pos) < sliding_window
        if not is_causal:
            in_window &= (k_pos - q_pos) < sliding_window
        if block_start is not None:  # rotating: block keys not windowed
            in_window |= k_pos >= block_start[:, None]
        visible &= in_window
    return visible


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor | None,
    scaling: float,
    *,
    explicit: bool,
    scores_hook: HookPoint | None = None,
    pattern_hook: HookPoint | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """softmax(q kᵀ · scaling + mask) v with GQA.

    q (B, H_q, L_q, d_h), k/v (B, H_kv, L_k, d_h) → output (B, H_q, L_q, d_h), and the weights
    (B, H_q, L_q, L_k) on the explicit path (None on the SDPA path).
    """
    groups = q.shape[1] // k.shape[1]
    if not explicit:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scaling, enable_gqa=groups > 1)
        return out, None
    k = repeat(k, "b hkv l d -> b (hkv g) l d", g=groups)  # (B, H_q, L_k, d_h)
    v = repeat(v, "b hkv l d -> b (hkv g) l d", g=groups)  # (B, H_q, L_k, d_h)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling  # (B, H_q, L_q, L_k)
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    if scores_hook is not None:
        scores = scores_hook(scores)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)  # rows sum to 1
    if pattern_hook is not None:
        weights = pattern_hook(weights)
    return torch.matmul(weights, v), weights


class KVInjectionAttention(nn.Module):
    def __init__(self, config: DraftConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        sliding = config.layer_type(layer_idx) == "sliding_attention"
        # official rule: sliding layers are causal unless the config's is_causal says otherwise
        self.is_causal = sliding if config.is_causal is None else bool(config.is_causal)
        self.sliding_window = config.sliding_window if sliding else None
        self.rotating = sliding and config.window_kind == "rotating"
        self.use_sdpa = True  # the explicit path is forced whenever hook_scores/hook_pattern is active
        self.hook_q = HookPoint()  # (B, H_q, L_q, d_h)        after QNorm, before RoPE
        self.hook_k_ctx = HookPoint()  # (B, H_kv, L_c, d_h)       after KNorm, before RoPE
        self.hook_k_noise = HookPoint()  # (B, H_kv, L_q, d_h)       after KNorm, before RoPE
        self.hook_v = HookPoint()  # (B, H_kv, L_c + L_q, d_h) [v_ctx; v_noise]
        self.hook_q_rot = HookPoint()  # (B, H_q, L_q, d_h)        after RoPE (last L_q positions)
        self.hook_k_rot = HookPoint()  # (B, H_kv, L_k, d_h)       after RoPE, cache prepended
        self.hook_scores = HookPoint()  # (B, H_q, L_q, L_k)        Q Kᵀ/√d_h, masked
        self.hook_pattern = HookPoint()  # (B, H_q, L_q, L_k)        softmax weights
        self.hook_out = HookPoint()  # (B, L_q, d)               after W_O

    def forward(
        self,
        hidden_states: torch.Tensor,
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        past_key_values: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states H (B, L_q, d), context C (B, L_c, d) → (B, L_q, d), weights or None.
        attention_mask: bool (L_q, L_k) of visible keys, replacing the layer's own rule (training, which
        folds that rule into it: training.block_masks)."""
        q_len = hidden_states.shape[1]
        heads = lambda x: rearrange(x, "b l (h d) -> b h l d", d=self.head_dim)  # noqa: E731
        q = self.hook_q(self.q_norm(heads(self.q_proj(hidden_states))))  # (B, H_q, L_q, d_h)
        k_ctx = self.hook_k_ctx(self.k_norm(heads(self.k_proj(context))))  # (B, H_kv, L_c, d_h)
        k_noise = self.hook_k_noise(self.k_norm(heads(self.k_proj(hidden_states))))  # (B, H_kv, L_q, d_h)
        k = torch.cat([k_ctx, k_noise], dim=2)  # (B, H_kv, L_c + L_q, d_h)
        v = torch.cat([heads(self.v_proj(context)), heads(self.v_proj(hidden_states))], dim=2)
        v = self.hook_v(v)  # (B, H_kv, L_c + L_q, d_h)
        cos, sin = position_embeddings
        q, k = apply_sliced_rope(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)  # (B, H_kv, L_k, d_h)
        q, k = self.hook_q_rot(q), self.hook_k_rot(k)
        visible = (
            attention_mask
            if attention_mask is not None
            else visibility_mask(
                q_len,
                k.shape[2],
                is_causal=self.is_causal,
                sliding_window=self.sliding_window,
                device=q.device,
                rotating=self.rotating,
            )
        )
        explicit = not self.use_sdpa or self.hook_scores.active or self.hook_pattern.active
        out, weights = attend(
            q,
            k,
            v,
            visible,
            self.scaling,
            explicit=explicit,
            scores_hook=self.hook_scores,
            pattern_hook=self.hook_pattern,
        )
        out = rearrange(out, "b h l d -> b l (h d)")  # (B, L_q, H_q · d_h)
        return self.hook_out(self.o_proj(out)), weights

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"causal={self.is_causal}, sliding_window={self.sliding_window}" + (", rotating" if self.rotating else "")
        )
