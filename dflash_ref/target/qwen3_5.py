"""An explicit Qwen3.5 / 3.6 hybrid causal LM, the target (parameter names of transformers' Qwen3_5ForCausalLM).

    h_0 = Embed(x)
    h'_l = h_{l−1} + Mixer_l(RMSNorm₁(h_{l−1})),  Mixer_l = GatedDeltaNet  if layer_types[l] = "linear_attention"
                                                            GatedAttn     if layer_types[l] = "full_attention"
    h_l = h'_l + MLP(RMSNorm₁(h'_l))                                                    (SwiGLU)
    logits = lm_head(RMSNorm₁(h_L))

RMSNorm₁ is Qwen3.5's norm with the weight stored as an offset from one: w' ⊙ x / rms(x), w' = 1 + w
(the gated norm inside Gated DeltaNet is not: see gated_deltanet.py). Gated attention, per head:

    [Q | G] = h W_Q (2·d_h per head),  Q ← QNorm(Q), K = KNorm(h W_K), V = h W_V     (QNorm/KNorm: RMSNorm₁)
    RoPE on the first d_rot = int(d_h · partial_rotary_factor) channels of Q and K, the rest pass
    A = softmax(Q Kᵀ / √d_h, causal) V,  out = W_O (A ⊙ sigmoid(G))                 GQA, over [cache; new]

Hidden states as in target/qwen3.py: index 0 the embedding, index l layer l's output, the last after the
final norm. The cache is a HybridCache (target/hybrid_cache.py): K/V for attention layers, per-position states
for linear layers, so crop(length) after a verify is exact. `Qwen3_5Target.from_hf(model)` copies a
transformers Qwen3_5ForCausalLM (the same state dict; `HybridConfig.from_hf` reads its config).
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn

from ..attention import attend, visibility_mask
from ..hooks import HookPoint, name_hook_points
from ..mlp import SwiGLU
from ..rope import RotaryEmbedding, apply_sliced_rope
from .gated_deltanet import GatedDeltaNet
from .hybrid_cache import KEEP_POSITIONS, HybridCache
from .qwen3 import OwnTarget, TargetOutput
from .qwen3_5_config import HybridConfig


class OffsetRMSNorm(nn.Module):
    """(1 + w) ⊙ x / sqrt(mean(x²) + eps), in float32, cast back after the weight (w init 0)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).type_as(x)


def partial_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on the first d_rot = cos.shape[-1] channels of q (B, H_q, L, d_h) and k (B, H_kv, L, d_h)."""
    rot = cos.shape[-1]
    q_rot, k_rot = apply_sliced_rope(q[..., :rot], k[..., :rot], cos, sin)
    return torch.cat([q_rot, q[..., rot:]], dim=-1), torch.cat([k_rot, k[..., rot:]], dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx, self.head_dim = layer_idx, config.head_dim
        self.scaling = self.head_dim**-0.5
        d, h_q, h_kv, bias = (
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.attention_bias,
        )
        self.q_proj = nn.Linear(d, h_q * self.head_dim * 2, bias=bias)  # query and gate, per head
        self.k_proj = nn.Linear(d, h_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, h_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(h_q * self.head_dim, d, bias=bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, config.rms_norm_eps)
        self.use_sdpa = True
        self.hook_pattern = HookPoint()  # (B, H_q, L, L_cache + L), off by default: it is large
        self.hook_gate = HookPoint()  # (B, L, H_q · d_h)  sigmoid(G)

    def forward(self, x: torch.Tensor, position_embeddings, cache: HybridCache | None) -> torch.Tensor:
        heads = lambda t: rearrange(t, "b l (h d) -> b h l d", d=self.head_dim)  # noqa: E731
        query, gate = rearrange(self.q_proj(x), "b l (h two d) -> two b h l d", two=2, d=self.head_dim)
        q = self.q_norm(query)  # (B, H_q, L, d_h)
        k = self.k_norm(heads(self.k_proj(x)))  # (B, H_kv, L, d_h)
        v = heads(self.v_proj(x))  # (B, H_kv, L, d_h)
        q, k = partial_rope(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, H_kv, L_cache + L, d_h)
        visible = visibility_mask(q.shape[2], k.shape[2], is_causal=True, sliding_window=None, device=x.device)
        out, _ = attend(
            q,
            k,
            v,
            visible,
            self.scaling,
            explicit=not self.use_sdpa or self.hook_pattern.active,
            pattern_hook=self.hook_pattern,
        )
        gate = self.hook_gate(torch.sigmoid(rearrange(gate, "b h l d -> b l (h d)")))  # (B, L, H_q · d_h)
        return self.o_proj(rearrange(out, "b h l d -> b l (h d)") * gate)  # (B, L, d)


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: HybridConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_type = config.layer_types[layer_idx]
        if self.layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, layer_idx)
        else:
            self.self_attn = GatedAttention(config, layer_idx)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, position_embeddings, cache):
        h = self.input_layernorm(x)
        mixed = (
            self.linear_attn(h, cache)
            if self.layer_type == "linear_attention"
            else self.self_attn(h, position_embeddings, cache)
        )
        x = x + mixed
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3_5Model(nn.Module):
    def __init__(self, config: HybridConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(HybridDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = OffsetRMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen3_5Target(OwnTarget):
    def __init__(self, config: HybridConfig, keep_positions: int = KEEP_POSITIONS) -> None:
        if not isinstance(config, HybridConfig):
            raise TypeError(
                f"Qwen3_5Target needs a HybridConfig (HybridConfig.from_hf reads a transformers "
                f"one), got {type(config).__name__}"
            )
        super().__init__(config, Qwen3_5Model)
        self.keep_positions = keep_positions
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta)
        name_hook_points(self, "target")

    @classmethod
    def from_hf(cls, model: nn.Module, keep_positions: int = KEEP_POSITIONS) -> Qwen3_5Target:
        """The own target with the weights of a transformers Qwen3_5ForCausalLM (same names, strict load)."""
        target = cls(HybridConfig.from_hf(model.config), keep_positions)
        target.load_state_dict(model.state_dict(), strict=True)
        first = next(model.parameters())
        return target.to(device=first.device, dtype=first.dtype).eval()

    def make_cache(self) -> HybridCache:
        return HybridCache(self.config.layer_types, self.keep_positions)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key_values: HybridCache | None = None,
        output_hidden_states: bool = True,
        logits_to_keep: int = 0,
    ) -> TargetOutput:
        """input_ids (B, L) → logits (B, L, V) (the last `logits_to_keep` if > 0) and hidden states."""
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"input_ids must be (batch, length ≥ 1), got {tuple(input_ids.shape)}")
        vocab = self.config.vocab_size
        if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
            raise ValueError(
                f"token ids must lie in 0..{vocab - 1}; got {int(input_ids.min())}..{int(input_ids.max())}"
            )
        if past_key_values is not None and not isinstance(past_key_values, HybridCache):
            raise TypeError(
                f"a hybrid target needs its own cache (target.make_cache()), got {type(past_key_values).__name__}"
            )
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]
        if int(position_ids.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the target's "
                f"max_position_embeddings {self.config.max_position_embeddings}"
            )
        x = self.embed(input_ids)  # (B, L, d)
        position_embeddings = self.rotary_emb(position_ids, x.dtype)  # (B, L, d_rot) ×2
        hidden_states = [x]
        for layer in self.model.layers:
            x = layer(x, position_embeddings, past_key_values)
            hidden_states.append(x)
        x = self.model.norm(x)
        hidden_states[-1] = x  # transformers' convention: the final entry is normed
        if logits_to_keep:
            x = x[:, -logits_to_keep:]  # (B, logits_to_keep, d)
        return TargetOutput(self.lm_head(x), tuple(hidden_states) if output_hidden_states else None)
