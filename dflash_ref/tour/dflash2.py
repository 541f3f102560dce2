"""Notebook 04's toy DFlash 2 draft, and its figure of the convolution by block position.

The same tiny target as notebooks 01 and 02 (demo.py); a DFlash 2 draft of the same width, with a
convolution of J = 3 taps over groups of 4 channels and a selector of rank 4 over the top M = 4 candidates,
random or trained for that target (toy_drafts.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from matplotlib.figure import Figure

from ..dflash2 import DFlash2DraftModel
from ..drafts.random_draft import randomize_
from .demo import demo_models, load_toy_weights_

DFLASH2_FIELDS = dict(version=2, conv_kernel_size=3, conv_group_size=4, selector_rank=4, selector_top_k=4)


def dflash2_models(seed: int = 0, block_size: int = 4, trained: bool = False):
    """(target, DFlash 2 draft, DFlash 1 draft): demo.py's pair, plus a DFlash 2 draft with the DFlash 1
    draft's config and DFLASH2_FIELDS, its weights N(0, 0.5²) from seed + 1 (norm weights 1), or with
    trained=True both drafts trained for the target."""
    target, dflash1 = demo_models(seed, block_size, trained)
    draft = randomize_(
        DFlash2DraftModel(dataclasses.replace(dflash1.config, **DFLASH2_FIELDS)), seed + 1, norm_jitter=None
    )
    return target, load_toy_weights_(draft) if trained else draft, dflash1


def plot_conv_positions(norms: dict[str, np.ndarray], labels: list[str]) -> Figure:
    """One heatmap per convolution: block positions (rows) × lags j (columns), each cell ‖term_{j,t}‖;
    the cells whose x_{t−j} lies before the block's start are grey: the convolution gives them 0."""
    fig = Figure(figsize=(3.6 * len(norms) + 1.2, 3.0), layout="constrained")
    axes = list(np.atleast_1d(fig.subplots(1, len(norms))))
    vmax = max(float(n.max()) for n in norms.values())
    for ax, (name, n) in zip(axes, norms.items()):
        length, kernel = n.shape
        before = np.arange(kernel)[None, :] > np.arange(length)[:, None]  # (L_q, J): t − j < 0
        image = ax.imshow(np.ma.masked_array(n, before), cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
        ax.imshow(np.ma.masked_array(np.ones_like(n), ~before), cmap="Greys", vmin=0, vmax=3, aspect="auto")
        for (t, j), v in np.ndenumerate(n):
            ax.text(
                j,
                t,
                "0\n(before block)" if before[t, j] else f"{v:.2f}",
                ha="center",
                va="center",
                fontsize=6.5,
                color="black" if before[t, j] else "white",
            )
        ax.set_xticks(range(kernel), ["x_t" if j == 0 else f"x_(t−{j})" for j in range(kernel)], fontsize=7)
        ax.set_yticks(range(length), labels, fontsize=7)
        ax.set_xlabel("lag j (input position t − j)", fontsize=8)
        ax.set_title(name, fontsize=8)
    axes[0].set_ylabel("block position t", fontsize=8)
    fig.colorbar(image, ax=axes, label="‖(w_j + a_t,j) ⊙ input_(t−j)‖")
    return fig
