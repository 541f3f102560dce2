"""An untrained DFlash draft sized to a given target (for demos, smoke checks and benchmarks).

Its width, heads, head_dim, vocabulary, RoPE base (and RoPE scaling, from the project's own
configs) and position limit are read off the target's config (the project's TargetConfig or a
transformers config); the target layers follow
`build_target_layer_ids`. Weights are N(0, std²) with norm weights 1. Its proposals are noise, so
τ ≈ 0 and the output is still exactly the target's: a random draft shows the loop is lossless,
not that it is fast (see `OracleDraft` for the ceiling).
"""

from __future__ import annotations

import torch

from ..config import DraftConfig, Qwen3Config
from ..dflash2 import make_draft
from ..draft_model import DFlashDraftModel
from ..loading.smollm2 import MASK_TOKEN_ID as SMOLLM2_MASK_TOKEN_ID


def randomize_(
    module: torch.nn.Module, seed: int, std: float = 0.5, norm_jitter: float | None = 0.2
) -> torch.nn.Module:
    """Fill every parameter from a seeded N(0, std²) (drawn on the CPU, then copied to its device).
    Norm weights become 1 + norm_jitter · N(0, std²), so that no stage is an accidental identity,
    or exactly 1 (and draw nothing) when norm_jitter is None."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("norm.weight") and norm_jitter is None:
                p.fill_(1.0)
                continue
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_((1 + norm_jitter * noise if name.endswith("norm.weight") else noise).to(p.device))
    return module.eval()


def identity_convolutions_(draft) -> None:
    """A DFlash 2 draft's convolutions set to the identity, in place: w_0 = 1, the other taps w_j and the
    projection W_a of the dynamic taps 0, so y_t = x_t and each layer computes what a DFlash 1 layer with
    its weights does (`train` starts its DFlash 2 drafts so: they learn to mix positions from there)."""
    # ours: the official post_init leaves base_kernel uninitialised, and no training recipe is published
    with torch.no_grad():
        for conv in convolutions(draft):
            conv.base_kernel.zero_()
            conv.base_kernel[:, 0] = 1.0  # (2, K, d): tap j = 0 of both
            conv.kernel_projection.weight.zero_()


def convolutions(draft) -> list:
    """A DFlash 2 draft's dynamic convolutions, two a layer (none for DFlash 1)."""
    return [
        conv
        for layer in draft.layers
        for conv in (getattr(layer, "attention_conv", None), getattr(layer, "mlp_conv", None))
        if conv is not None
    ]


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def draft_config_for(
    target_config, num_hidden_layers: int = 3, block_size: int = 16, mask_token_id: int | None = None, **fields
) -> DraftConfig:
    """A draft config shaped after the target's; `fields` add or override (e.g. DFlash 2's sizes)."""
    c = target_config
    heads = c.num_attention_heads
    return DraftConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(c),
        rope_scaling=c.rope_scaling if isinstance(c, Qwen3Config) else None,
        max_position_embeddings=c.max_position_embeddings,
        num_target_layers=c.num_hidden_layers,
        block_size=block_size,
        mask_token_id=c.vocab_size - 1 if mask_token_id is None else mask_token_id,
        **fields,
    )


def random_draft(
    target,
    num_hidden_layers: int = 3,
    block_size: int = 16,
    mask_token_id: int | None = None,
    seed: int = 0,
    std: float = 0.02,
    **fields,
) -> DFlashDraftModel:
    """A random draft on the target's device and dtype (`fields`: more config, e.g. DFlash 2's)."""
    config = draft_config_for(target.config, num_hidden_layers, block_size, mask_token_id, **fields)
    with torch.device("meta"):
        draft = make_draft(config)
    randomize_(draft.to_empty(device=target.device), seed, std, norm_jitter=None)
    return draft.to(target.dtype).eval()


def random_smollm2_draft(
    target, num_hidden_layers: int = 3, block_size: int = 16, seed: int = 0, **fields
) -> DFlashDraftModel:
    """An untrained draft of SmolLM2's size (proposals are noise: τ ≈ 0, output still lossless)."""
    return random_draft(target, num_hidden_layers, block_size, SMOLLM2_MASK_TOKEN_ID, seed, **fields)
