"""Start a draft from its target's own decoder layers instead of noise (`train --init target`).

Not in the paper (it trains its drafts from a random start); a departure for small data budgets, where
a draft layer that already is a language-model layer has less to learn (measured: figures/training/levers.md).
The draft's layers have the target's shapes, so its last N layers can be copied in:

    layers.i     ← target layer L_i (q/k/v/o, gate/up/down, input and post-attention norms)
    q_norm, k_norm ← 1 where the target has none (a Llama target; a Qwen3 target's are copied)
    fc           ← [0 … 0 | I]: the context starts as the deepest sampled layer's hidden state
    hidden_norm  ← layer L_0's input norm: draft layer 0 first reads the context as L_0 reads its input
    norm         ← the target's final norm
"""

from __future__ import annotations

import torch
from torch import nn


def _decoder(target) -> nn.Module:
    """The module holding `layers` and `norm`: the project's Qwen3 target or a transformers causal LM."""
    for inner in (target.model, getattr(target.model, "model", None)):
        if inner is not None and isinstance(getattr(inner, "layers", None), nn.ModuleList) and hasattr(inner, "norm"):
            return inner
    raise TypeError(f"{type(target).__name__} exposes no decoder `layers` and `norm` to copy from")


def init_from_target(draft, target, layer_ids: list[int] | None = None):
    """Copy target layers `layer_ids` (default: the last N) into the draft's N layers, in place."""
    decoder = _decoder(target)
    n_target, n_draft = len(decoder.layers), len(draft.layers)
    layer_ids = list(range(n_target - n_draft, n_target)) if layer_ids is None else list(layer_ids)
    if len(layer_ids) != n_draft:
        raise ValueError(f"the draft has {n_draft} layers; got {len(layer_ids)} target layers to copy: {layer_ids}")
    if any(not 0 <= i < n_target for i in layer_ids):
        raise ValueError(f"target layer ids {layer_ids} out of range: the target has {n_target} layers")
    d = draft.config.hidden_size
    with torch.no_grad():
        for layer, i in zip(draft.layers, layer_ids):
            source = dict(decoder.layers[i].named_parameters())
            for name, p in layer.named_parameters():
                if name in source:
                    if source[name].shape != p.shape:
                        raise ValueError(
                            f"target layer {i} {name} is {tuple(source[name].shape)}, the draft's "
                            f"is {tuple(p.shape)}: the draft must have the target's shapes"
                        )
                    p.copy_(source[name])
                elif name.endswith(("q_norm.weight", "k_norm.weight")):
                    p.fill_(1.0)
                elif name.startswith(("attention_conv.", "mlp_conv.")):
                    continue  # DFlash 2's: no target counterpart (random_draft.identity_convolutions_)
                else:
                    raise ValueError(f"target layer {i} has no {name} to copy")
        draft.fc.weight.zero_()
        draft.fc.weight[:, -d:] = torch.eye(d)  # (d, k·d): the last sampled layer
        draft.hidden_norm.weight.copy_(decoder.layers[layer_ids[0]].input_layernorm.weight)
        draft.norm.weight.copy_(decoder.norm.weight)
    return draft
