"""An explicit Qwen3 causal LM, the target (same parameter names as transformers' Qwen3ForCausalLM).

    h_0 = Embed(x)
    h_l = h'_l + MLP(RMSNorm(h'_l)),  h'_l = h_{l−1} + Attn_causal(RMSNorm(h_{l−1}))   l = 1..L
    logits = lm_head(RMSNorm_final(h_L))          (lm_head tied to Embed when tie_word_embeddings)

Attention: Q = QNorm(h W_Q), K = KNorm(h W_K), V = h W_V per head, RoPE on both (the sliced-Q RoPE
with L_c = 0), causal over [cache; new], GQA. It returns every hidden state: index 0 is the embedding
output and index l the output of layer l, the layout that `extract_context_feature` reads with its
+1 offset. As in transformers, the last entry (l = L) is taken *after* the final norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..attention import attend, visibility_mask
from ..cache import KVCache
from ..config import TargetConfig
from ..hooks import HookPoint, name_hook_points
from ..mlp import SwiGLU
from ..rmsnorm import RMSNorm
from ..rope import RotaryEmbedding, apply_sliced_rope


@dataclass
class TargetOutput:
    logits: torch.Tensor  # (B, L, V)
    hidden_states: tuple[torch.Tensor, ...] | None  # L_t + 1 tensors (B, L, d), embedding output first


class Qwen3Attention(nn.Module):
    def __init__(self, config: TargetConfig, layer_idx: int, qk_norm: bool = True) -> None:
        super().__init__()
        self.layer_idx, self.head_dim = layer_idx, config.head_dim
        self.scaling = self.head_dim**-0.5
        d = config.hidden_size
        self.q_proj = nn.Linear(d, config.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, config.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, config.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, d, bias=False)
        # Llama (target/llama.py) has no per-head norm: no q_norm / k_norm, none in the state dict
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if qk_norm else None
        self.use_sdpa = True
        self.hook_pattern = HookPoint()  # (B, H_q, L, L_cache + L), off by default: it is large

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, L, H·d_h) → (B, H, L, d_h). A reshape and a transpose, not einops' rearrange, which does the
        same at several µs of Python per call: 90 calls in each of decoding's forwards."""
        return t.reshape(*t.shape[:2], -1, self.head_dim).transpose(1, 2)  # (B, L, H, d_h) → (B, H, L, d_h)

    def forward(
        self, x: torch.Tensor, position_embeddings, cache: KVCache | None, visible: torch.Tensor | None
    ) -> torch.Tensor:
        """visible: the forward's mask, bool (L, L_cache + L), or None where every key is visible."""
        q, k, v = self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # (B, H_q, L, d_h), (B, H_kv, L, d_h)
        q, k = apply_sliced_rope(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, H_kv, L_cache + L, d_h)
        out, _ = attend(
            q,
            k,
            v,
            visible,
            self.scaling,
            explicit=not self.use_sdpa or self.hook_pattern.active,
            pattern_hook=self.hook_pattern,
        )
        return self.o_proj(out.transpose(1, 2).flatten(2))  # (B, H_q, L, d_h) → (B, L, H_q·d_h) → (B, L, d)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: TargetConfig, layer_idx: int, qk_norm: bool = True) -> None:
        super().__init__()
        self.self_attn = Qwen3Attention(config, layer_idx, qk_norm)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, position_embeddings, cache, visible):
        x = x + self.self_attn(self.input_layernorm(x), position_embeddings, cache, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3Model(nn.Module):
    def __init__(self, config: TargetConfig, qk_norm: bool = True) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen3DecoderLayer(config, i, qk_norm) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class OwnTarget(nn.Module):
    """What the project's own targets (this Qwen3, target/qwen3_5.py's hybrid) share: `model.embed_tokens`,
    an `lm_head` (tied to it when the config says so), and the target protocol's accessors on them. The
    config is validated before `make_model(config)` builds the layers, so a bad one is named, not a shape."""

    def __init__(self, config, make_model) -> None:
        super().__init__()
        config.validate()
        self.config, self.model = config, make_model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def output_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def output_weight(self) -> torch.Tensor:
        """The lm_head matrix (V, d): logits = hidden @ output_weight().T (training takes rows of it)."""
        return self.lm_head.weight


class Qwen3Target(OwnTarget):
    qk_norm = True  # False: a Llama (target/llama.py)

    def __init__(self, config: TargetConfig) -> None:
        super().__init__(config, lambda c: Qwen3Model(c, self.qk_norm))
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        name_hook_points(self, "target")

    def make_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        past_key_values: KVCache | None = None,
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
        past = past_key_values.get_seq_length() if past_key_values is not None else 0
        if position_ids is None:
            position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)[None]
        if int(position_ids.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the target's "
                f"max_position_embeddings {self.config.max_position_embeddings}"
            )
        x = self.embed(input_ids)  # (B, L, d)
        position_embeddings = self.rotary_emb(position_ids, x.dtype)  # (B, L, d_h) ×2
        hidden_states = [x]
        # one mask for every layer; None for a single query, which sees every key (decoding's AR step)
        q_len, k_len = input_ids.shape[1], past + input_ids.shape[1]
        visible = (
            visibility_mask(q_len, k_len, is_causal=True, sliding_window=None, device=x.device) if q_len > 1 else None
        )  # bool (L, L_cache + L)
        for layer in self.model.layers:
            x = layer(x, position_embeddings, past_key_values, visible)
            hidden_states.append(x)
        x = self.model.norm(x)
        hidden_states[-1] = x  # transformers' convention: the final entry is normed
        if logits_to_keep:
            x = x[:, -logits_to_keep:]  # (B, logits_to_keep, d)
        return TargetOutput(self.lm_head(x), tuple(hidden_states) if output_hidden_states else None)
