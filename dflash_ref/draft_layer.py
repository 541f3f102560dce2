"""One DFlash decoder layer (seed: "Decoder Layer ×N: LN → KV Injection Attention → Res.; LN → MLP → Res.").

    H' = H + Attn(RMSNorm_in(H), C)            (K/V get C injected; see attention.py)
    H'' = H' + MLP(RMSNorm_post(H'))           (SwiGLU)

C is the already-projected context (fc + hidden_norm), shared by all layers; it is *not* normed
again here, while H is. The two sublayers are methods (`attend`, `feed_forward`) so that a layer
that changes what is around them (dflash2.py) extends this one without touching it.

# diff with official: the keyword `blocks` says how many equal blocks the L_q query rows hold. Only
# training passes it (many blocks side by side in one pass, training/recipe.py); a DFlash 1 layer ignores
# it, and a DFlash 2 layer restarts its convolutions at each block (dynamic_conv.py).
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
        context: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        past_key_values: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,
        *,
        blocks: int = 1,
    ) -> torch.Tensor:
        """H (B, L_q, d), C (B, L_c, d) → H'' (B, L_q, d)."""
        x = self.input_layernorm(hidden_states)
        attended = self.attend(x, context, position_embeddings, past_key_values, attention_mask, blocks=blocks)
        hidden_states = self.hook_resid_mid(hidden_states + attended)
        x = self.post_attention_layernorm(hidden_states)
        hidden_states = hidden_states + self.feed_forward(x, blocks=blocks)
        return self.hook_resid_post(hidden_states)

    def attend(self, x, context, position_embeddings, past_key_values, attention_mask, *, blocks: int = 1):
        """Attn(x, C): x (B, L_q, d) already normed, C (B, L_c, d), RoPE's cos/sin, the draft cache and a
        visibility mask (attention.py) → (B, L_q, d)."""
        return self.self_attn(x, context, position_embeddings, past_key_values, attention_mask)[0]

    def feed_forward(self, x: torch.Tensor, *, blocks: int = 1) -> torch.Tensor:
        """MLP(x), x (B, L_q, d) already normed."""
        return self.mlp(x)
