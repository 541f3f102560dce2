"""Hook points: named identity modules where a tensor can be read (or, in tests, replaced).

    y = hook(x) = x            (nothing registered: the identity)

Every stage of the walk (layer sampling, context projection, Q/K/V, RoPE, attention scores and
weights, layer outputs) passes its tensor through a `HookPoint`; its *name* is the module path
(`draft.layers.0.self_attn.hook_pattern`, as in TransformerLens). Hooks are only ever attached
inside a `with` block (`hooks(...)`), so nothing leaks after a run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]


class HookPoint(nn.Module):
    """Identity module with a stable name; `forward(x) == x` unless a scoped hook replaces it."""

    def __init__(self) -> None:
        super().__init__()
        self.name = ""  # filled in by `name_hook_points` with the module path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # fast path: with nothing attached (here or globally) a hook point is a bare identity,
        # skipping nn.Module's call machinery, so untraced runs pay (almost) nothing for it
        if self._forward_hooks or self._forward_pre_hooks or _global_forward_hooks or _global_forward_pre_hooks:
            return super().__call__(x)
        return x

    @property
    def active(self) -> bool:
        """True while a hook is attached: the attention uses it to force the explicit path."""
        return bool(self._forward_hooks)


def name_hook_points(root: nn.Module, prefix: str = "") -> None:
    """Give every HookPoint below `root` its dotted module path (with `prefix.` in front)."""
    for path, module in root.named_modules():
        if isinstance(module, HookPoint):
            module.name = f"{prefix}.{path}" if prefix else path


def hook_points(*roots: nn.Module) -> dict[str, HookPoint]:
    """All hook points under the given modules, by name."""
    found: dict[str, HookPoint] = {}
    for root in roots:
        for path, module in root.named_modules():
            if isinstance(module, HookPoint):
                found[module.name or path] = module  # a module built on its own: its local path
    return found


@contextlib.contextmanager
def hooks(
    roots: list[nn.Module] | nn.Module, fn: HookFn, names: Callable[[str], bool] | None = None
) -> Iterator[list[str]]:
    """Attach `fn(tensor, hook_point)` to every hook point whose name passes `names`.

    The hooks are removed when the block ends, also on an exception. Yields the names attached.
    `fn` may return a tensor to replace the activation (used by tests); None keeps it.
    """
    roots = roots if isinstance(roots, (list, tuple)) else [roots]
    handles, attached = [], []
    try:
        for name, point in hook_points(*roots).items():
            if names is None or names(name):
                handles.append(point.register_forward_hook(lambda mod, args, out: fn(out, mod)))
                attached.append(name)
        yield attached
    finally:
        for handle in handles:
            handle.remove()
