"""The lm_head product, logits = hidden · Wᵀ, (…, d) × (V, d)ᵀ → (…, V), with a CPU fast path.

On a CPU, for an fp32 head and a few rows (2 … 64: a verify block, or the draft's γ = b − 1
proposals), `F.linear` takes a path several times slower than writing the same product as
(W · hiddenᵀ)ᵀ. Measured on this 2-core CPU for SmolLM2's 49152 × 576 head (median of 15, random
inputs; `F.linear` against (W·hᵀ)ᵀ): 2 rows 23.5 / 4.1 ms, 4 rows 18.3 / 6.8, 8 rows 16.9 / 7.6,
16 rows 19.2 / 15.8, 64 rows 36.2 / 32.1; 1 row 10.1 / 10.3 and 512 rows 207.5 / 272.8 (so those keep
`F.linear`), and in bf16 `F.linear` is the faster at every row count. The two differ by float
rounding only (the order of the d-term sums).

Used twice: `head_product` for the draft's proposals (target.output_head), and `RowsFirstLinear`,
which an HFTarget puts in place of its model's plain lm_head so that the target's own forward (one
token per step for AR, a block for verification) takes the same path; one row, what AR decoding
computes, is `F.linear` either way.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

ROWS_FIRST = range(2, 65)      # row counts for which (W·hᵀ)ᵀ beats F.linear (fp32, CPU, measured above)


def head_product(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """hidden (…, d), weight (V, d) → logits (…, V), contiguous."""
    rows = hidden.numel() // max(hidden.shape[-1], 1)
    if (hidden.device.type != "cpu" or hidden.dtype != torch.float32 or weight.dtype != torch.float32
            or bias is not None or rows not in ROWS_FIRST):
        return F.linear(hidden, weight, bias)
    flat = hidden.reshape(rows, hidden.shape[-1])                             # (N, d)
    return (weight @ flat.T).T.contiguous().reshape(*hidden.shape[:-1], weight.shape[0])   # (N, V) → (…, V)


class RowsFirstLinear(nn.Linear):
    """An nn.Linear whose forward is `head_product`: the same module, parameters and state dict."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return head_product(hidden, self.weight, self.bias)


def use_rows_first(head: nn.Module) -> bool:
    """Switch a plain, bias-free nn.Linear head to RowsFirstLinear in place (its class only: the
    weight, tying and hooks stay). Anything else (a custom head, a bias) is left alone: False."""
    if type(head) is not nn.Linear or head.bias is not None:
        return type(head) is RowsFirstLinear
    head.__class__ = RowsFirstLinear
    return True
