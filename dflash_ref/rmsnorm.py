"""RMSNorm, the normalisation used everywhere in Qwen3 and DFlash.

    RMSNorm(x) = w ⊙ x / sqrt(mean(x²) + eps)

The mean runs over the last dimension. It is computed in float32 and cast back before the weight
is applied (the same order as transformers' Qwen3RMSNorm, so bf16 results agree bit for bit).
The seed uses it three ways: `hidden_norm` on C, per-head QNorm / KNorm, and the pre-norms.
"""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"RMSNorm over {self.weight.shape[0]} features got a tensor of shape "
                f"{tuple(x.shape)} (last dimension must be {self.weight.shape[0]})"
            )
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
