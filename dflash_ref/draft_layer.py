"""One DFlash decoder layer (seed: "Decoder Layer ×N: LN → KV Injection Attention → Res.; LN → MLP → Res.").

    H' = H + Attn(RMSNorm_in(H), C)            (K/V get C injected; see attention.py)
    H'' = H' + MLP(RMSNorm_post(H'))           (SwiGLU)

C is the already-projected context (fc + hidden_norm), shared by all layers; it is *not* normed
again here, while H is. A DFlash 2 layer wraps each sublayer f in its dynamic convolution
(dynamic_conv.py): H + finish(f(prepare(RMSNorm(H)))).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import KVInjectionAttention
from .cache import KVCache
from .config import DraftConfig
from .dynamic_conv import GroupedDynamicCausalConv
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
        self.attention_conv = self.mlp_conv = None  # DFlash 1
        if config.version == 2:
            convs = [
                GroupedDynamicCausalConv(config.hidden_size, config.conv_kernel_size, config.conv_group_size)
                for _ in range(2)
            ]
            self.attention_conv, self.mlp_conv = convs
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

        def attention(x):
            return self.self_attn(x, target_hidden, position_embeddings, past_key_values, attention_mask)[0]

        hidden_states = self.hook_resid_mid(
            hidden_states + _around(self.attention_conv, attention, self.input_layernorm(hidden_states), blocks)
        )
        hidden_states = hidden_states + _around(
            self.mlp_conv, self.mlp, self.post_attention_layernorm(hidden_states), blocks
        )
        return self.hook_resid_post(hidden_states)


def _around(conv: GroupedDynamicCausalConv | None, sublayer, x: torch.Tensor, blocks: int) -> torch.Tensor:
    """f(x) (DFlash 1), or finish(f(prepare(x))) with the taps of x (DFlash 2), each block on its own."""
    if conv is None:
        return sublayer(x)
    prepared, taps = conv.prepare(x, blocks)
    return conv.finish(sublayer(prepared), taps, blocks)
