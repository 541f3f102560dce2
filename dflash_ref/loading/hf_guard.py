"""Which transformers models a crop cannot roll back: refuse them before they decode wrongly.

Speculative decoding verifies L tokens, accepts τ + 1 of them and crops the cache back:

    K/V layers:       K ← K[:, :, :n]           exact (each position's K/V stands alone)
    recurrent layers: S_n = f(S_{n−1}, x_n)     a state that folds in every token: no slice undoes x_{n+1..}

transformers' DynamicCache.crop trims a linear-attention layer's conv window but leaves its recurrent
state with the rejected tokens in (on Qwen3.5, after a verify of 4 and crop(−3), the next logits are
far from a plain forward's), so HFTarget would decode such a model silently wrong. A model is refused when any of these
says it carries such a state:

    model._is_stateful                     transformers' own flag (it refuses assisted generation for them)
    config.layer_types ∋ a recurrent type  "linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding", …
    a module of a recurrent kind           Gated DeltaNet, Mamba mixers, short convs, RG-LRU, RWKV, xLSTM, …

Qwen3.5 / 3.6 hybrids decode exactly through the own target: `Qwen3_5Target.from_hf(model)`.
"""

from __future__ import annotations

import re

from torch import nn

RECURRENT_LAYER_TYPES = (
    "linear_attention",
    "conv",
    "mamba",
    "mamba2",
    "hybrid",
    "hybrid_sliding",
    "recurrent",
    "rwkv",
    "lightning_attention",
    "deltanet",
)
RECURRENT_MODULE = re.compile(
    r"(GatedDeltaNet|DeltaNet|Mamba\d*Mixer|MambaMixer|Mamba\d*Layer|Mixer$|ShortConv|"
    r"LightningAttention|LinearAttention|Recurrent|Rglru|RGLRU|Rwkv|RWKV|xLSTM|Lstm|LSTM)"
)


class UnrollableTarget(TypeError):
    """A target whose cache holds states that cropping cannot roll back."""


def _layer_types(config) -> list[str]:
    found = []
    for c in (config, getattr(config, "text_config", None)):
        found += list(getattr(c, "layer_types", None) or [])
    return found


def recurrent_parts(model: nn.Module) -> list[str]:
    """What in `model` keeps a state that a crop cannot undo: layer types, module classes, the flag."""
    config = getattr(model, "config", None)
    parts = sorted({f"layer type {t!r}" for t in _layer_types(config) if str(t) in RECURRENT_LAYER_TYPES})
    parts += sorted(
        {f"module {type(m).__name__}" for m in model.modules() if RECURRENT_MODULE.search(type(m).__name__)}
    )
    if getattr(model, "_is_stateful", False):
        parts.append(f"{type(model).__name__}._is_stateful")
    return parts


def check_rollback(model: nn.Module) -> None:
    """Raise UnrollableTarget, naming the layer type, if the model's cache cannot be cropped exactly."""
    parts = recurrent_parts(model)
    if parts:
        hint = (
            " Use dflash_ref.target.Qwen3_5Target.from_hf(model), whose cache rolls Gated DeltaNet states back exactly."
            if type(model).__name__ == "Qwen3_5ForCausalLM"
            else ""
        )
        raise UnrollableTarget(
            f"{type(model).__name__} keeps recurrent states ({', '.join(parts)}): a cache crop after a rejected "
            "draft cannot roll them back, so speculative decoding through HFTarget would not be lossless." + hint
        )
