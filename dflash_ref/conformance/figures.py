"""Figures of a verify report: the error along the data's walk, and the first diverging tensor.

Each function takes reports or arrays and returns a matplotlib Figure (numpy and matplotlib only).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .report import Report
from .stages import TITLES

FLOOR, OFF_SCALE = 1e-10, 1e2  # exact agreement is drawn at FLOOR; integer and shape failures at OFF_SCALE


def plot_walk(*reports: Report, bundle: str | None = None) -> Figure:
    """Scaled error of every tensor of one bundle (default: the first), in walk order, one line per
    report; integer or shape failures drawn above the axis; the first divergence marked."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax = fig.add_subplot()
    bundle = bundle or reports[0].checks[0].bundle
    for report in reports:
        checks = [c for c in report.checks if c.bundle == bundle]
        y = [OFF_SCALE if report.failed(c) and (c.detail or not c.tolerance) else max(c.rel, FLOOR) for c in checks]
        (line,) = ax.plot(range(len(checks)), y, ".-", lw=0.8, ms=3, label=report.impl)
        first = next((i for i, c in enumerate(checks) if report.failed(c)), None)
        if first is not None:
            c = checks[first]
            ax.axvline(first, color=line.get_color(), ls=":", lw=1)
            ax.annotate(
                f"first divergence: {TITLES.get(c.stage, c.stage)}\n{c.where}",
                (first, y[first]),
                xytext=(6, 12),
                textcoords="offset points",
                fontsize=8,
                color=line.get_color(),
            )
    checks = [c for c in reports[0].checks if c.bundle == bundle]
    ax.step(
        range(len(checks)), [c.tolerance or np.nan for c in checks], where="mid", color="grey", lw=1, label="tolerance"
    )
    starts = [i for i, c in enumerate(checks) if i == 0 or c.step != checks[i - 1].step]
    ax.set_xticks(starts, [f"step {checks[i].step}" if checks[i].step is not None else "" for i in starts], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(FLOOR / 3, OFF_SCALE * 3)
    ax.set_ylabel("max|Δ| / max(1, max|expected|)")
    ax.set_title(
        f"bundle {bundle}: every tensor along the walk (exact = {FLOOR:g}, integer / shape failure = {OFF_SCALE:g})",
        fontsize=10,
    )
    ax.legend(fontsize=8, loc="center right")
    return fig


def plot_tensor_diff(
    expected: np.ndarray,
    got: np.ndarray,
    title: str = "",
    head: int = 0,
    axes_names: tuple[str, str] = ("row", "column"),
) -> Figure:
    """Expected, got and |got − expected| side by side (of a 3-d tensor the slice `head` of its first axis,
    e.g. one attention head); `axes_names` labels the rows and columns of what is drawn (e.g. block position,
    d_h), whose ticks are whole indices."""
    expected, got = np.asarray(expected, np.float64), np.asarray(got, np.float64)
    if expected.ndim > 2:
        expected, got = expected[head], got[head]
    while expected.ndim > 2:
        expected, got = expected[0], got[0]
    expected, got = np.atleast_2d(expected), np.atleast_2d(got)
    fig = Figure(figsize=(10, 3.2), layout="constrained")
    axes = fig.subplots(1, 3)
    vmax = max(np.abs(expected).max(), np.abs(got).max(), 1e-12)
    for ax, data, name, cmap, lim in [
        (axes[0], expected, "expected", "RdBu_r", (-vmax, vmax)),
        (axes[1], got, "got", "RdBu_r", (-vmax, vmax)),
        (axes[2], np.abs(got - expected), "|got − expected|", "magma", (0, None)),
    ]:
        image = ax.imshow(data, cmap=cmap, vmin=lim[0], vmax=lim[1], aspect="auto")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(axes_names[1], fontsize=8)
        ax.set_ylabel(axes_names[0], fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # indices: no half-integer ticks
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    return fig
