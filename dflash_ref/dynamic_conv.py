"""DFlash 2's grouped dynamic causal convolution, around each sublayer of a draft layer.

Over the block's positions t = 0..L_q − 1, with the channels split into G groups of size d / G and J taps
(`conv_kernel_size`; the seed's K is the keys, so the taps are J here):

    y_t = Σ_{j<J} (w_j + a_{t,j,g}) ⊙ x_{t−j}        x_{t−j} = 0 before the block's first position

w_j (d,) a learned tap per channel (`base_kernel`), a_{t,j,g} a dynamic tap shared by the channels of
group g, computed from the sublayer's *input* x_t: a_t = W_a x_t (`kernel_projection`, 2·J·G outputs).
The two halves of a_t (and of w) serve two convolutions around one sublayer f:

    prepare   u = conv(x;  w⁰, a⁰(x))            the sublayer's input, mixed over the last J positions
    finish    y = conv(f(u);  w¹, a¹(x))         its output, mixed with the taps of the same x

so a draft layer is H' = H + finish(Attn(prepare(RMSNorm(H)), C)), H'' = H' + finish(MLP(prepare(RMSNorm(H')))).
The convolution runs inside one block: it restarts at every block's first position (the context never
enters it), which is why a draft pass needs no convolution state across steps. Training puts m blocks
of equal length side by side in one pass (`blocks=m`): each is convolved on its own.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn
from torch.nn import functional as F

from .hooks import HookPoint


def convolve(x: torch.Tensor, taps: torch.Tensor, base: torch.Tensor, group_size: int, blocks: int = 1) -> torch.Tensor:
    """y_t = Σ_j (w_j + a_{t,j,g}) ⊙ x_{t−j}: x (B, L, d), taps a (B, L, J, G), base w (J, d) → (B, L, d);
    L = blocks · l, every block of l positions restarted (x before its first position is 0)."""
    if blocks > 1:
        if x.shape[1] % blocks:
            raise ValueError(f"{x.shape[1]} positions do not split into {blocks} blocks of equal length")
        y = convolve(
            rearrange(x, "b (m l) d -> (b m) l d", m=blocks),  # (B·m, l, d)
            rearrange(taps, "b (m l) k g -> (b m) l k g", m=blocks),
            base,
            group_size,
        )
        return rearrange(y, "(b m) l d -> b (m l) d", m=blocks)  # (B, m·l, d)
    kernel_size = base.shape[0]
    x = rearrange(x, "b l (g c) -> b l g c", c=group_size)  # (B, L, G, d/G)
    w = rearrange(base, "k (g c) -> k g c", c=group_size).to(x.dtype)  # (J, G, d/G)
    y = torch.zeros_like(x)
    for j in range(min(kernel_size, x.shape[1])):  # taps reaching before the block: 0
        shifted = F.pad(x[:, : x.shape[1] - j], (0, 0, 0, 0, j, 0))  # x_{t−j}, zeros before t = j
        y = y + w[j] * shifted  # the learned tap, per channel
        y = torch.addcmul(y, taps[:, :, j, :, None], shifted)  # the dynamic tap, per group
    return rearrange(y, "b l g c -> b l (g c)")


class GroupedDynamicCausalConv(nn.Module):
    """The two convolutions around one sublayer: `prepare` before it, `finish` after it."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int) -> None:
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(f"conv_group_size {group_size} does not divide hidden_size {hidden_size}")
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden_size))  # w⁰, w¹
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)  # W_a
        self.hook_taps = HookPoint()  # (B, L_q, 2, J, G)  a_t: both halves
        self.hook_prepared = HookPoint()  # (B, L_q, d)        u, the sublayer's input
        self.hook_finished = HookPoint()  # (B, L_q, d)        y, after the sublayer

    def prepare(self, x: torch.Tensor, blocks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, L_q, d) → (u, a¹): the convolved input and the taps `finish` will use."""
        taps = rearrange(self.kernel_projection(x), "b l (h k g) -> b l h k g", h=2, k=self.kernel_size)
        taps = self.hook_taps(taps)  # (B, L_q, 2, J, G)
        prepared = convolve(x, taps[:, :, 0], self.base_kernel[0], self.group_size, blocks)
        return self.hook_prepared(prepared), taps[:, :, 1]

    def finish(self, out: torch.Tensor, taps: torch.Tensor, blocks: int = 1) -> torch.Tensor:
        """The sublayer's output (B, L_q, d) convolved with the taps of its input (B, L_q, J, G)."""
        return self.hook_finished(convolve(out, taps, self.base_kernel[1], self.group_size, blocks))

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, groups={self.groups}, group_size={self.group_size}"
