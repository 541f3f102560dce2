"""The planned linear layer: y = x · Wᵀ (+ b), (…, d_in) × (d_out, d_in)ᵀ → (…, d_out), computed by the
kernel measured fastest on this machine for the number of rows and the layer's shape.

Decoding asks a linear layer for a few rows at a time: one token (AR), a block of b (verification),
b − 1 proposals (the draft's logits). For those, torch's fp32 CPU `F.linear` is not always the
fastest exact way: on some machines one row goes to a slower matrix-vector kernel and 2 … 3 rows
cost about that many single rows, while (W · xᵀ)ᵀ runs on the matrix-matrix kernel; on others
F.linear is the fastest of all. So the choice is measured, not assumed (plan.py: the kernels, how
they are timed, the store of plans, DFLASH_REF_LINEAR to pin one):

    rows 1 … 64, fp32, CPU, no grad, no autocast    the plan's kernel for (d_out, d_in, rows)
    otherwise (prefill's many rows, bf16, autocast, grad mode, another device)    F.linear

Every kernel gives F.linear's numbers up to float rounding (the order of the d_in-term sums), and
F.linear is kept unless another is clearly faster. `PlannedLinear` is an nn.Linear with this
forward: the same module, parameters and state dict. It can also hold the copies of W that two
kernels read (W's d_in columns in slices, Wᵀ made contiguous), made once when the plan first asks
for them and remade when the weight changes (`PlannedLinear.copies` says what it notices); weights
over 2²⁴ elements or made in inference mode are not copied. `switch_linears` turns a model's plain
nn.Linear layers into PlannedLinear and back (the switch of __init__.py, `use_fast_cpu`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from . import streamed
from .plan import COPIES, KERNELS, MAX_COPY, MEASURED_ROWS, kernel_for


def linear_product(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    copies: Callable[[str], list[torch.Tensor] | None] | None = None,
) -> torch.Tensor:
    """x (…, d_in), weight (d_out, d_in), bias (d_out,) or None → x · weightᵀ + bias (…, d_out),
    contiguous, by the plan's kernel. `copies(kernel)` (PlannedLinear's) gives the parts of W a
    kernel of plan.COPIES reads; without it those kernels are not candidates."""
    rows = x.numel() // max(x.shape[-1], 1)
    if (
        torch.is_grad_enabled()
        or rows not in MEASURED_ROWS
        or x.dtype != torch.float32
        or weight.dtype != torch.float32
        or not x.is_cpu
        or not weight.is_cpu
        or weight.dim() != 2
        or x.shape[-1] != weight.shape[-1]
        or torch.is_autocast_enabled("cpu")
    ):
        return F.linear(x, weight, bias)  # incl. its own shape errors, and autocast's bf16 products
    name = kernel_for(weight, rows, copies is not None and can_copy(weight))
    if name == "linear":
        return F.linear(x, weight, bias)
    if name == "streamed":  # the C product takes x as it is: no reshape of x or of y (µs each)
        y = streamed.product(x, weight)  # (…, d_in) → (…, d_out)
    else:
        parts = copies(name) if name in COPIES else [weight]
        y = KERNELS[name](x.reshape(rows, x.shape[-1]), parts)  # (N, d_in) → (N, d_out)
        y = y.reshape(*x.shape[:-1], weight.shape[0])  # (N, d_out) → (…, d_out)
    if bias is not None:
        y += bias
    return y


def can_copy(weight: torch.Tensor) -> bool:
    """Whether a PlannedLinear may keep copies of this weight: at most MAX_COPY elements (memory),
    and not made in inference mode (such a tensor has no version count to notice changes by)."""
    return weight.numel() <= MAX_COPY and not weight.is_inference()


class PlannedLinear(nn.Linear):
    """An nn.Linear whose forward is `linear_product`: the same module, parameters and state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_product(x, self.weight, self.bias, self.copies)

    def copies(self, kernel: str) -> list[torch.Tensor] | None:
        """The parts of W that `kernel` (one of plan.COPIES) reads, copied once per weight and
        remade when the weight is replaced, reassigned through `.data`, or changed by an in-place op
        that autograd counts (not by one on `weight.data`, which bypasses the count: call
        `forget_copies`); None for a weight `can_copy` refuses, or in grad mode (a gradient must
        reach `weight` itself)."""
        w = self.weight
        if torch.is_grad_enabled() or not can_copy(w):
            return None
        # the weight itself, weakly (a replaced one is not kept alive), its storage and its version
        source, ptr, version = getattr(self, "_copies_key", (None, None, None))
        if source is None or source() is not w or ptr != w.data_ptr() or version != w._version:
            self._copies_of_weight = {}
            self._copies_key = (weakref.ref(w), w.data_ptr(), w._version)
        made = self._copies_of_weight
        if kernel not in made:
            with torch.no_grad():
                made[kernel] = COPIES[kernel](w.detach())
        return made[kernel]

    def forget_copies(self) -> None:
        """Drop the cached copies (they are made again from the weight when next needed)."""
        self.__dict__.pop("_copies_key", None)
        self.__dict__.pop("_copies_of_weight", None)

    def __getstate__(self) -> dict:
        """Copies and pickles leave the cached copies out: a copy's weight has its own version count."""
        state = super().__getstate__()
        return {k: v for k, v in state.items() if k not in ("_copies_key", "_copies_of_weight")}


def switch_linears(model: nn.Module, on: bool = True) -> int:
    """Switch every plain nn.Linear inside `model` to PlannedLinear (`on`), or every PlannedLinear back
    to nn.Linear, in place: the class only (the weights, tying and hooks stay); subclasses and other
    modules are left alone. → how many switched."""
    switched = 0
    for module in model.modules():
        if type(module) is (nn.Linear if on else PlannedLinear):
            if not on:
                module.forget_copies()
            module.__class__ = PlannedLinear if on else nn.Linear
            switched += 1
    return switched
