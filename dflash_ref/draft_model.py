"""The DFlash draft model (seed: "Draft Head 架构").

    C = RMSNorm(W_fc · target_hidden)                      (context.py)
    H_0 = noise_embedding                                   (target's embed_tokens of the block)
    H_n = DecoderLayer_n(H_{n−1}, C)   n = 1..N             (draft_layer.py)
    out = RMSNorm_final(H_N)            (B, L_q, d)         → target.lm_head outside → logits
    logits = cap · tanh(m · z / cap)  (z the head's logits, m = output_multiplier, cap the softcap if set)

    d_1..d_γ = argmax logits (greedy), or d_i ~ q_i = softmax(logits_i / T) (sampled, top-p/top-k applied)

DFlash 2 (dflash2.py) extends this class: its layers and its proposals.

No embedding and no lm_head of its own: the target's are reused. Parameter names are the official
ones (`layers.{i}.…`, `fc`, `hidden_norm`, `norm`), so one `load_state_dict` moves weights between
this model and the official `DFlashDraftModel` or any port. `forward` takes the official keywords.
# diff with official: `forward` also takes `blocks`, training's alone (draft_layer.py says why).
"""

from __future__ import annotations

import torch
from torch import nn

from .acceptance import sample_probs, sampling_probs
from .cache import KVCache
from .config import ConfigError, DraftConfig
from .context import ContextHooks, project_context
from .draft_layer import DFlashDecoderLayer
from .hooks import HookPoint, name_hook_points
from .rmsnorm import RMSNorm
from .rope import RotaryEmbedding


class DFlashDraftModel(nn.Module):
    version = 1  # the config's `version` this class builds
    decoder_layer = DFlashDecoderLayer

    def __init__(self, config: DraftConfig) -> None:
        super().__init__()
        config.validate()
        if config.version != self.version:
            raise ConfigError(
                f"a DFlash {config.version} config cannot build a DFlash {self.version} draft: "
                "make_draft(config) (dflash2.py) builds the class of the config's version"
            )
        self.config = config
        d = config.hidden_size
        self.layers = nn.ModuleList(self.decoder_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.fc = nn.Linear(len(config.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = RMSNorm(d, config.rms_norm_eps)
        self.context = ContextHooks()
        self.hook_noise_embedding = HookPoint()  # (B, L_q, d)
        self.hook_target_hidden = HookPoint()  # (B, L_c, k·d) the sampled target layers, concatenated
        self.hook_out = HookPoint()  # (B, L_q, d) after the final norm
        self.hook_logits = HookPoint()  # (B, L_q − 1, V) the proposals' logits (−∞ outside a draft vocabulary)
        name_hook_points(self, "draft")
        # the token ids its folder restricts its proposals to (draft_vocab.json), None = all V; not a weight (the
        # state dict stays the official one); spec_generate applies it only through extensions/draft_vocab.py
        self.draft_vocab: torch.Tensor | None = None

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> list[int]:
        return self.config.target_layer_ids

    def make_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def forward(
        self,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | list | None = None,
        *,
        noise_embedding: torch.Tensor,
        target_hidden: torch.Tensor,
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        blocks: int = 1,
    ) -> torch.Tensor:
        """noise_embedding (B, L_q, d), target_hidden (B, L_c, k·d), position_ids (B, L_c + L_q)
        → block hidden states (B, L_q, d).

        position_ids cover the *new* context positions followed by the block's; K/V of earlier
        context come from `past_key_values` (which this call appends to: crop it afterwards).
        attention_mask: None (the layers' own rule: non-causal), or a bool (L_q, L_k) of visible keys
        for every layer, or a list of them, one per layer; training uses it to put many blocks in one
        pass (training/recipe.py), with `blocks` = how many equal blocks the L_q rows hold (a DFlash 2
        convolution restarts at each).
        """
        self._check_inputs(position_ids, noise_embedding, target_hidden)
        masks = self._layer_masks(attention_mask, noise_embedding.shape[1], target_hidden.shape[1], past_key_values)
        if use_cache and past_key_values is None:
            raise ValueError("use_cache=True needs past_key_values (make one with draft.make_cache())")
        hidden_states = self.hook_noise_embedding(noise_embedding)
        context = project_context(
            self.hook_target_hidden(target_hidden), self.fc, self.hidden_norm, self.context
        )  # (B, L_c, d)
        position_embeddings = self.rotary_emb(position_ids, hidden_states.dtype)  # (B, L_c + L_q, d_h) ×2
        for layer, mask in zip(self.layers, masks):
            hidden_states = layer(hidden_states, context, position_embeddings, past_key_values, mask, blocks=blocks)
        return self.hook_out(self.norm(hidden_states))

    def _layer_masks(self, attention_mask, q_len: int, ctx_len: int, past_key_values) -> list:
        """attention_mask as one entry per layer, each None or a checked bool (L_q, L_k)."""
        n = len(self.layers)
        if attention_mask is None:
            return [None] * n
        masks = [attention_mask] * n if isinstance(attention_mask, torch.Tensor) else list(attention_mask)
        if len(masks) != n:
            raise ValueError(f"attention_mask: a list of {len(masks)} masks for {n} layers")
        cached = past_key_values.get_seq_length() if past_key_values is not None else 0
        keys = cached + ctx_len + q_len
        for mask in masks:
            if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and tuple(mask.shape) == (q_len, keys)):
                raise ValueError(
                    f"attention_mask must be a bool (L_q, L_k) = ({q_len}, {keys}) tensor (or a list of "
                    f"them, one per layer), got {getattr(mask, 'dtype', type(mask).__name__)} "
                    f"{tuple(getattr(mask, 'shape', ()))}"
                )
        return masks

    def _check_inputs(self, position_ids, noise_embedding, target_hidden) -> None:
        d, k = self.config.hidden_size, len(self.config.target_layer_ids)
        if noise_embedding.dim() != 3 or noise_embedding.shape[-1] != d:
            raise ValueError(f"noise_embedding must be (batch, block, {d}), got {tuple(noise_embedding.shape)}")
        if target_hidden.dim() != 3 or target_hidden.shape[-1] != k * d:
            raise ValueError(
                f"target_hidden must be (batch, ctx_len, {k * d}) = {k} target layers × "
                f"hidden {d}, got {tuple(target_hidden.shape)}"
            )
        if target_hidden.shape[0] != noise_embedding.shape[0]:
            raise ValueError(
                f"batch sizes differ: noise_embedding {noise_embedding.shape[0]}, "
                f"target_hidden {target_hidden.shape[0]}"
            )
        expected = target_hidden.shape[1] + noise_embedding.shape[1]
        if (
            position_ids.dim() != 2
            or position_ids.shape[1] != expected
            or position_ids.shape[0] not in (1, noise_embedding.shape[0])
        ):
            raise ValueError(
                f"position_ids must be (batch, ctx_len + block) = (·, {expected}), got {tuple(position_ids.shape)}"
            )
        if position_ids.numel() and int(position_ids.max()) >= self.config.max_position_embeddings:
            raise ValueError(
                f"position {int(position_ids.max())} is beyond the draft's "
                f"max_position_embeddings {self.config.max_position_embeddings}"
            )

    def compute_logits(self, hidden: torch.Tensor, output_head: nn.Module) -> torch.Tensor:
        """Block hidden states → logits with the target's lm_head (× output_multiplier, softcapped)."""
        logits = output_head(hidden) * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return self.hook_logits(torch.tanh(logits / cap) * cap if cap else logits)

    def choose_tokens(self, hidden, logits, anchor, temperature: float, top_p: float, top_k: int):
        """d_1..d_γ (1, γ) from the block's logits (1, γ, V): drawn from q = sampling_probs(logits) at
        T > 0, else the argmax → (tokens, q (1, γ, V) or None, None: q is over all V). `hidden` (1, γ, d)
        and `anchor` x_0 (1,) are what a draft that proposes otherwise reads (dflash2.py)."""
        if temperature == 0:
            return logits.argmax(dim=-1), None, None
        draft_probs = sampling_probs(logits, temperature, top_p, top_k)
        return sample_probs(draft_probs), draft_probs, None
