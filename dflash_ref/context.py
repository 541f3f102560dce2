"""Context projection (seed: "投影与归一化").

    C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)])        W_fc: (k·d) → d, no bias

`target_hidden` (B, L_c, k·d) → C (B, L_c, d). C is computed once per draft pass and shared by
every draft layer, where it becomes the context half of K and V. The modules themselves (`fc`,
`hidden_norm`) live on the draft model so that the state-dict names stay the official ones.
"""

from __future__ import annotations

import torch
from torch import nn

from .hooks import HookPoint


class ContextHooks(nn.Module):
    """The two hook points of the context projection: after fc, and after RMSNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.hook_fc = HookPoint()  # (B, L_c, d): W_fc · target_hidden
        self.hook_context = HookPoint()  # (B, L_c, d): C


def project_context(
    target_hidden: torch.Tensor, fc: nn.Linear, hidden_norm: nn.Module, hooks: ContextHooks | None = None
) -> torch.Tensor:
    """target_hidden (B, L_c, k·d) → C (B, L_c, d)."""
    if target_hidden.dim() != 3 or target_hidden.shape[-1] != fc.in_features:
        raise ValueError(
            f"target_hidden must be (batch, ctx_len, {fc.in_features}) = (B, L_c, "
            f"len(target_layer_ids) · hidden_size), got {tuple(target_hidden.shape)}"
        )
    projected = fc(target_hidden)  # (B, L_c, d)
    if hooks is not None:
        projected = hooks.hook_fc(projected)
    context = hidden_norm(projected)  # (B, L_c, d)
    return hooks.hook_context(context) if hooks is not None else context
