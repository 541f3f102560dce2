"""Linear layers on a CPU: y = x · Wᵀ (+ b), (…, d_in) × (d_out, d_in)ᵀ → (…, d_out), computed by
whichever of several equal ways is faster for the number of rows and the layer's width.

Decoding asks a linear layer for a few rows at a time: one token (AR), a block of b (verification),
b − 1 proposals (the draft's logits). For those, this torch's fp32 CPU `F.linear` can be slow: one
row goes to a matrix-vector kernel, and 2 … 3 rows cost about that many single rows. The same
product written as (W · xᵀ)ᵀ, a single row duplicated into two columns, runs on the matrix-matrix
kernel:

    rows = 1                  y = (W · [x; x]ᵀ)[:, 0]ᵀ               (d_out, 2) → (1, d_out)
    rows 2 … 64               y = (W · xᵀ)ᵀ                          (d_out, N) → (N, d_out)
    rows 3 … 6, d_in > 768    y = (Σ_j W[:, S_j] · x[:, S_j]ᵀ)ᵀ        RowsFirstLinear only: the d_in
                              columns cut into ⌈d_in / 768⌉ slices S_j, each W[:, S_j] copied once
    otherwise, bf16 or autocast, or not on a CPU:   F.linear

They differ by float rounding only (the order of the d_in-term sums). The row counts and the slice
width come from timings on the machines this project has run on (figures/bench/README.md, "The CPU
linear"), which is why the choice is a rule of thumb, not a law: on another CPU F.linear may win.
The slices are contiguous copies of W[:, S_j] (strided views run slower than the whole product),
made once and remade when the weight changes (`RowsFirstLinear.slices` says what it notices); weights
over 2²⁴ elements are not copied (memory), and grad mode keeps the plain path (decoding runs in
inference mode).

`RowsFirstLinear` is an nn.Linear with this forward; `use_rows_first` switches a model's plain
nn.Linear layers to it where models are made or loaded (HFTarget, load_draft, random_draft), and
`linear_product` is what the draft's proposals go through (target.output_head,
extensions/draft_vocab.py).
"""
from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

ROWS_FIRST = range(1, 65)      # row counts computed as (W·xᵀ)ᵀ (fp32, CPU): faster there when measured
SPLIT_ROWS = range(3, 7)       # row counts whose product over a wide d_in goes by slices (when measured)
SPLIT_WIDTH = 768              # the widest slice of d_in
SPLIT_MAX_WEIGHT = 1 << 24     # elements; a larger weight is not copied into slices


def linear_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   slices: Callable[[], list[torch.Tensor] | None] | None = None) -> torch.Tensor:
    """x (…, d_in), weight (d_out, d_in), bias (d_out,) or None → (…, d_out), contiguous. `slices`
    (RowsFirstLinear's), asked only for SPLIT_ROWS rows on the rows-first path: W's d_in columns cut
    in order into contiguous (d_out, w_j) pieces, or None for the whole product."""
    rows = x.numel() // max(x.shape[-1], 1)
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 or rows not in ROWS_FIRST
            or x.shape[-1] != weight.shape[-1] or torch.is_autocast_enabled("cpu")):
        return F.linear(x, weight, bias)   # incl. its own shape errors, and autocast's bf16 products
    flat = x.reshape(rows, x.shape[-1])                                       # (N, d_in)
    pieces = slices() if slices is not None and rows in SPLIT_ROWS else None
    if pieces:
        y_t, start = pieces[0] @ flat[:, :pieces[0].shape[1]].T, pieces[0].shape[1]   # (d_out, N)
        for piece in pieces[1:]:                                              # yᵀ += W[:, S_j] · x[:, S_j]ᵀ
            y_t.addmm_(piece, flat[:, start:start + piece.shape[1]].T)
            start += piece.shape[1]
    elif rows == 1:  # two columns: the matrix-matrix kernel, not the slower matrix-vector one
        y_t = (weight @ torch.cat([flat, flat]).T)[:, :1]                     # (d_out, 2) → (d_out, 1)
    else:
        y_t = weight @ flat.T                                                 # (d_out, N)
    y = y_t.T                                                                 # (d_out, N) → (N, d_out)
    if bias is not None:
        y = y + bias
    return y.contiguous().reshape(*x.shape[:-1], weight.shape[0])            # (N, d_out) → (…, d_out)


class RowsFirstLinear(nn.Linear):
    """An nn.Linear whose forward is `linear_product`: the same module, parameters and state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_product(x, self.weight, self.bias, self.slices)

    def slices(self) -> list[torch.Tensor] | None:
        """W's d_in columns in ⌈d_in / SPLIT_WIDTH⌉ contiguous slices, copied once per weight and remade
        when the weight is replaced, reassigned through `.data`, or changed by an in-place op that
        autograd counts (not by one on `weight.data`, which bypasses the count: call `forget_slices`);
        None for a d_in ≤ SPLIT_WIDTH, a weight over SPLIT_MAX_WEIGHT elements or made in inference
        mode (it has no version count), or in grad mode (a gradient must reach `weight`, or reach x
        through slices that inference mode may have made, which autograd cannot save)."""
        w = self.weight
        if (w.shape[1] <= SPLIT_WIDTH or w.numel() > SPLIT_MAX_WEIGHT or torch.is_grad_enabled()
                or w.is_inference()):
            return None
        # the weight itself, weakly (a replaced one is not kept alive), its storage and its version
        source, ptr, version = getattr(self, "_slices_key", (None, None, None))
        if source is None or source() is not w or ptr != w.data_ptr() or version != w._version:
            with torch.no_grad():
                pieces = torch.tensor_split(w.detach(), -(-w.shape[1] // SPLIT_WIDTH), dim=1)
                self._slices_of_weight = [p.contiguous() for p in pieces]     # (d_out, w_j) each
            self._slices_key = (weakref.ref(w), w.data_ptr(), w._version)
        return self._slices_of_weight

    def forget_slices(self) -> None:
        """Drop the cached slices (they are made again from the weight when next needed)."""
        self.__dict__.pop("_slices_key", None)
        self.__dict__.pop("_slices_of_weight", None)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the cached slices out: a copy's weight has its own version count."""
        state = super().__getstate__()
        return {k: v for k, v in state.items() if k not in ("_slices_key", "_slices_of_weight")}


def use_rows_first(model: nn.Module) -> int:
    """Switch every plain nn.Linear inside `model` to RowsFirstLinear, in place (the class only: the
    weights, tying and hooks stay); subclasses and other modules are left alone. → how many switched."""
    switched = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = RowsFirstLinear
            switched += 1
    return switched
