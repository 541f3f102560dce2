"""Grouped-query attention for a transformers model, without repeating the key and value heads.

A model with H query heads and G < H key/value heads (SmolLM2: 9 and 3; Qwen3: 16 and 8) lets query
head h read key/value head ⌊h / (H/G)⌋. transformers' "eager" attention makes that explicit by
copying every key and value head H/G times (repeat_kv) before its two products, at every layer of
every step: in batched decoding (training/distill.py) it copies the whole cache twice per layer per
token. Here the H/G query heads of a group ride on its one key/value head instead:

    q (B, H, n, d) → (B, G, (H/G)·n, d)          the group's query rows, one after another
    s = q · kᵀ · scaling + mask                  (B, G, (H/G)·n, L) → (B, G, H/G, n, L), mask per (n, L)
    p = softmax(s) in fp32, cast back            as eager does
    o = p · v                                    (B, G, (H/G)·n, d_v) → (B, H, n, d_v)

the same dot products as eager's (each one the same d-term sum), with no copy of the cache.
Registered with transformers as GROUPED (its mask the one eager gets); `register()` is idempotent.

SDPA_GROUPED is transformers' "sdpa" attention with one change: on a CPU, a masked call (a verify block
of q > 1 tokens after the cache; a padded batch) passes the G key/value heads to torch's SDPA with
enable_gqa=True instead of repeating them H/G times first, which transformers does whenever there is a
mask (its reason, a slow math kernel, holds on CUDA). On the CPU the result is bit for bit the same
(tests/test_grouped_attention.py) and a verify saves one copy of each layer's cache, a large share of
a small model's attention time. HFTarget switches a model on "sdpa" to it (`use_sdpa_grouped`).
What a model passes beyond plain attention (attention sinks, logit soft-capping, a position bias,
sparse key indices: any keyword outside SAFE_KEYWORDS that is not None) is refused with
UnsupportedAttention, never ignored; distill.py then falls back to the model's eager attention.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

# not "dflash_…": transformers takes a name containing "flash" for a flash-attention kernel to import
GROUPED = "grouped_kv"
SDPA_GROUPED = "grouped_kv_sdpa"
# what Llama, Qwen2/3, Mistral and Gemma 3 pass besides q, k, v, the mask and the scaling (sliding_window
# is in the mask already), and what eager itself ignores; any other keyword changes the attention
SAFE_KEYWORDS = frozenset(
    {
        "position_ids",
        "sliding_window",
        "use_cache",
        "output_attentions",
        "cache_position",
        "is_causal",
        "past_key_values",
        "cu_seq_lens_q",
        "cu_seq_lens_k",
        "max_length_q",
        "max_length_k",
        "output_hidden_states",
    }
)


class UnsupportedAttention(NotImplementedError):
    """A model's attention has a part grouped_attention does not compute (named): use its own."""


def beyond_plain(module, kwargs: dict) -> list[str]:
    """What a call asks beyond plain attention: its keywords outside SAFE_KEYWORDS that are not None, and the
    module's attention sinks."""
    return [name for name, v in kwargs.items() if v is not None and name not in SAFE_KEYWORDS] + (
        ["sinks"] if getattr(module, "sinks", None) is not None else []
    )


def grouped_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    """transformers' attention interface: query (B, H, n, d), key (B, G, L, d), value (B, G, L, d_v), an additive
    float or a boolean (True: attend) mask broadcastable to (B, 1, n, L) → ((B, n, H, d_v), p (B, H, n, L))."""
    unsupported = beyond_plain(module, kwargs)
    if unsupported:
        raise UnsupportedAttention(
            f"{GROUPED} attention has no {', '.join(sorted(set(unsupported)))} "
            f"({type(module).__name__}): use the model's own attention implementation"
        )
    batch, heads, n, d = query.shape
    groups = key.shape[1]
    if heads % groups:
        raise ValueError(f"{heads} query heads do not split into {groups} key/value groups")
    per_group = heads // groups  # H/G
    q = query.reshape(batch, groups, per_group * n, d)  # (B, G, (H/G)·n, d)
    scores = torch.matmul(q, key.transpose(2, 3)) * scaling  # (B, G, (H/G)·n, L)
    scores = scores.view(batch, groups, per_group, n, -1)  # (B, G, H/G, n, L)
    if attention_mask is not None:
        mask = attention_mask[:, :, None, :, : scores.shape[-1]]  # (B, 1, 1, n, L)
        # a boolean mask as eager's float one: the dtype's lowest, not −inf, so that a row with no key (a
        # left pad's) gets finite weights, not NaNs that would reach the cache's padded values
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool else scores + mask
    p = F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    p = F.dropout(p, p=dropout, training=module.training)
    out = torch.matmul(p.view(batch, groups, per_group * n, -1), value)  # (B, G, (H/G)·n, d_v)
    out = out.view(batch, heads, n, value.shape[-1])  # (B, H, n, d_v)
    return out.transpose(1, 2).contiguous(), p.view(batch, heads, n, -1)


def sdpa_grouped_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
):
    """transformers' sdpa attention, but a masked call on a CPU reads the G key/value heads in place
    (enable_gqa) → ((B, n, H, d_v), None). Anything else, or anything beyond plain attention, is
    transformers' own sdpa_attention_forward, unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    if (
        attention_mask is None
        or groups == 1
        or beyond_plain(module, kwargs)
        or not query.is_cpu
        or key.shape[-1] != value.shape[-1]
        or query.shape[1] != key.shape[1] * groups
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )  # (B, H, n, d_v)
    return out.transpose(1, 2).contiguous(), None  # (B, n, H, d_v)


def use_sdpa_grouped(model) -> bool:
    """Switch a transformers model on "sdpa" attention to SDPA_GROUPED (registered once); others are left
    as they are. → whether it was switched."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SDPA_GROUPED, sdpa_grouped_attention)
    AttentionMaskInterface.register(SDPA_GROUPED, sdpa_mask)
    try:
        model.set_attn_implementation(SDPA_GROUPED)
    except (ValueError, TypeError):  # a model that takes no custom attention: its own sdpa stays
        return False
    return True


def register() -> str:
    """Make GROUPED a name `model.set_attn_implementation` takes (its mask: eager's) → the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED, grouped_attention)
    AttentionMaskInterface.register(GROUPED, eager_mask)
    return GROUPED
