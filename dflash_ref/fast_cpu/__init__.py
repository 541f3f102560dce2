"""The fast CPU path: an opt-in extension, off unless asked for (`use_fast_cpu(model)`, or
`generate --fast-cpu`).

The reference computes every linear layer with plain `nn.Linear` (`F.linear`). Decoding on a CPU asks
each layer for a few rows at a time (1 token in AR, a block of b in a verify, b − 1 proposals), and for
those `F.linear` is not always torch's fastest exact product on every machine. This extension swaps a
model's plain nn.Linear layers for `PlannedLinear` (linear.py), whose forward takes, per weight shape
and row count, the kernel measured fastest on the machine at hand (plan.py), among torch's own products
and one written here in C (streamed.c, compiled at first use where a C compiler is found: streamed.py).
Plans are measured once per machine and stored (plan_store.py).

What it is, exactly:

    exact up to float rounding   every kernel sums the same d_in terms in another order (F.linear's
                                 numbers to ~1e-7 relative in fp32), so greedy decoding can part from
                                 the plain path only at a near-tie of two logits
    measured per machine         a kernel replaces F.linear only where it is clearly faster here;
                                 `DFLASH_REF_LINEAR=linear` pins F.linear (`plan.set_linear_mode`)
    where it acts                fp32, CPU, 1 … 64 rows, no grad; everything else is F.linear

`python -m dflash_ref bench baselines steps` measures it beside the plain path. Nothing in the
equations, the walkthrough, the conformance kit or training uses it.
"""

from __future__ import annotations

from torch import nn

from .linear import PlannedLinear, linear_product, switch_linears
from .plan import measuring_seconds

__all__ = ["PlannedLinear", "linear_product", "measuring_seconds", "use_fast_cpu"]


def use_fast_cpu(model: nn.Module, on: bool = True) -> nn.Module:
    """Switch `model`'s plain nn.Linear layers (a target's lm_head included) to the planned products, in
    place, and → the model; `on=False` switches them back to plain nn.Linear."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"use_fast_cpu takes a torch module (a target, a draft), got {type(model).__name__}")
    switch_linears(model, on)
    return model
