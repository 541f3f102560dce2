"""One DFlash decoder layer (seed: "Decoder Layer ×N: LN → KV Injection Attention → Res.; LN → MLP → Res.").

    H' = H + Attn(RMSNorm_in(H), C)            (K/V get C injected; see attention.py)
    H'' = H' + MLP(RMSNorm_post(H'))           (SwiGLU)

C is the already-projected context (fc + hidden_norm), shared by all layers; it is *not* normed
again here, while H is. The two sublayers are methods (`attend`, `feed_forward`) so that a layer
that changes what is around them (dflash2.py) extends this one without touching it.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import KVInjectionAttention
from .cache import KVCache
from .config import DraftConfig
from .hooks import HookPoint
from .mlp import SwiGLU
from .rmsnorm import RMSNorm


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DraftConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = KVInjectionAttention(config, layer_idx)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hook_resid_mid = HookPoint()  # (B, L_q, d): H'
        self.hook_resid_post = HookPoint()  # (B, L_q, d): H'', the layer output

    def forward(
        self,
        hidden_states: torch.Tensor,
        target_hidden: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        past_key_values: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        blocks: int = 1,
    ) -> torch.Tensor:
        """`blocks`: the L_q query rows are that many equal blocks side by side (training's one pass)."""
        context = (target_hidden, position_embeddings, past_key_values, attention_mask)
        attended = self.attend(self.input_layernorm(hidden_states), context, blocks)
        hidden_states = self.hook_resid_mid(hidden_states + attended)
        hidden_states = hidden_states + self.feed_forward(self.post_attention_layernorm(hidden_states), blocks)
        return self.hook_resid_post(hidden_states)

    def attend(self, x: torch.Tensor, context: tuple, blocks: int) -> torch.Tensor:
        """Attn(x, C), x (B, L_q, d) already normed; `context` = (C, RoPE cos/sin, cache, mask)."""
        return self.self_attn(x, *context)[0]

    def feed_forward(self, x: torch.Tensor, blocks: int) -> torch.Tensor:
        """MLP(x), x (B, L_q, d) already normed."""
        return self.mlp(x)
