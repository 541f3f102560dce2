"""Figures from a Trace. Every function takes a trace (or a step record) and returns a matplotlib
Figure; nothing is shown or saved here (`save_figure` writes deterministic PNGs).

    plot_attention            one step / layer / head: L_q × L_k, context | block boundary marked
    plot_draft_and_verify     one step: the draft's non-causal pattern beside the target's causal verify
    plot_attention_grid       every layer × head of one step
    plot_attention_steps      one layer / head across steps (the context grows, the block slides)
    plot_attention_compare    the same head of several drafts side by side (trained vs random)
    plot_cache_timeline       target vs draft cache length around every verify / draft and crop
    plot_acceptance           τ per step, and its histogram
    plot_rope_alignment       which position each Q row and K column is rotated by
    plot_candidate_lattice    DFlash 2: block positions × top-M candidates, the chosen path, the accepted prefix
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import MaxNLocator

from . import StepRecord, Trace

CONTEXT_COLOUR, BLOCK_COLOUR = "#1f77b4", "#d62728"


def _subplots(figsize, rows: int = 1, cols: int = 1, **kw):
    """A Figure without pyplot: no global state, no backend switch, nothing to close."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, cols, **kw)


def _labels(positions: Sequence[int], tokens: Sequence[str] | None, start: int) -> list[str]:
    """'position:token'; block positions after x_0 show the mask the draft was given."""
    if tokens is None:
        return [str(p) for p in positions]
    return [f"{p}:<mask>" if p > start else f"{p}:{tokens[p]}" if p < len(tokens) else str(p) for p in positions]


def _heatmap(ax, weights: np.ndarray, record: StepRecord, ctx_cols: int, tokens, title: str, annotate: bool) -> None:
    im = ax.imshow(weights, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.axvline(ctx_cols - 0.5, color="white", linewidth=2)
    q_pos, k_pos = record.q_position_ids, record.k_position_ids
    if len(k_pos) <= 40:
        ax.set_xticks(range(len(k_pos)), _labels(k_pos, tokens, record.start), rotation=90, fontsize=7)
    if len(q_pos) <= 40:
        ax.set_yticks(range(len(q_pos)), _labels(q_pos, tokens, record.start), fontsize=7)
    if annotate and weights.size <= 400:
        for (i, j), w in np.ndenumerate(weights):
            ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=6, color="black" if w > 0.5 else "white")
    ax.set_title(title, fontsize=8)
    return im


def plot_attention(
    trace: Trace, step: int, layer: int, head: int, tokens: Sequence[str] | None = None, annotate: bool = True
) -> Figure:
    """Draft attention weights (L_q × L_k) of one head; the white line splits context | block."""
    weights = trace.attention(step, layer)[head].float().numpy()
    record, ctx_cols = trace.records[step], trace.context_columns(step)
    fig, ax = _subplots((1.2 + 0.42 * weights.shape[1], 1.4 + 0.42 * weights.shape[0]))
    im = _heatmap(
        ax,
        weights,
        record,
        ctx_cols,
        tokens,
        f"step {step} · layer {layer} · head {head}  (context {ctx_cols} | block {weights.shape[1] - ctx_cols})",
        annotate,
    )
    ax.set_xlabel("key position (K)")
    ax.set_ylabel("query position (Q = block)")
    fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    return fig


def plot_draft_and_verify(
    trace: Trace, step: int, layer: int, head: int, target_layer: int, tokens: Sequence[str]
) -> Figure:
    """One step's two passes over its block, side by side: the draft's attention (layer, head: the block
    [x_0, mask, …] reads every key, non-causal) and the target's at the verify (target_layer, head: the block
    [x_0, d_1, …] as proposed, causal, so the cells above the diagonal are masked, drawn hatched). `tokens`:
    the text of every position up to the block's end, the block as verified."""
    record = trace.records[step]
    target_name = f"target.model.layers.{target_layer}.self_attn.hook_pattern"
    if target_name not in trace.activations[step]:
        raise KeyError(f"the trace holds no {target_name} at step {step}: trace the target too")
    panels = [
        ("draft", trace.attention(step, layer)[head], trace.context_columns(step), f"draft layer {layer}", True),
        ("verify", trace[target_name, step][head], record.start, f"target layer {target_layer} (the verify)", False),
    ]
    width = sum(w.shape[1] for _, w, *_ in panels)
    fig = Figure(figsize=(2.4 + 0.5 * width, 2.2 + 0.45 * len(record.q_position_ids)), layout="constrained")
    axes = fig.subplots(1, 2, width_ratios=[w.shape[1] for _, w, *_ in panels])
    for ax, (kind, weights, ctx_cols, title, drafted) in zip(axes, panels):
        weights = weights.float().numpy()
        q_pos = list(range(record.start, record.start + weights.shape[0]))  # the block's positions
        k_pos = list(range(weights.shape[1])) if kind == "verify" else record.k_position_ids
        image = ax.imshow(weights, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
        if kind == "verify":  # the causal mask: key position > query position
            for i, qp in enumerate(q_pos):
                for j, kp in enumerate(k_pos):
                    if kp > qp:
                        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="#dddddd", hatch="//", lw=0))
        for (i, j), w in np.ndenumerate(weights):
            if kind == "draft" or k_pos[j] <= q_pos[i]:
                ax.text(j, i, f"{w:.2f}", ha="center", va="center", fontsize=6, color="black" if w > 0.5 else "white")
        ax.axvline(ctx_cols - 0.5, color="white", linewidth=2)
        names = [f"{p}:<mask>" if drafted and p > record.start else f"{p}:{tokens[p]}" for p in range(len(k_pos))]
        ax.set_xticks(range(len(k_pos)), [names[p] for p in k_pos], rotation=90, fontsize=7)
        ax.set_yticks(range(len(q_pos)), [names[p] for p in q_pos], fontsize=7)
        ax.set_xlabel(f"key position ({'context' if drafted else 'cache'} | block)")
        ax.set_title(f"{title}, head {head}: {'non-causal' if drafted else 'causal'}", fontsize=9)
    axes[0].set_ylabel("query: the block's positions")
    fig.colorbar(image, ax=axes, fraction=0.03, label="attention weight")
    fig.suptitle(f"step {step}: the draft pass and the verify pass over the same positions", fontsize=10)
    return fig


def plot_attention_grid(trace: Trace, step: int, tokens: Sequence[str] | None = None) -> Figure:
    """Every draft layer (rows) × head (columns) at one step."""
    layers = sorted(
        {int(n.split(".")[2]) for n in trace.keys() if n.endswith("self_attn.hook_pattern") and n.startswith("draft.")}
    )
    if not layers:
        raise KeyError("the trace holds no draft attention patterns (record '*hook_pattern')")
    heads = trace.attention(step, layers[0]).shape[0]
    fig, axes = _subplots((2.6 * heads, 2.2 * len(layers)), len(layers), heads, squeeze=False)
    for r, layer in enumerate(layers):
        weights = trace.attention(step, layer).float().numpy()
        for h in range(heads):
            _heatmap(
                axes[r, h],
                weights[h],
                trace.records[step],
                trace.context_columns(step),
                tokens,
                f"layer {layer} · head {h}",
                annotate=False,
            )
    fig.suptitle(f"draft attention, step {step} (white line: context | block)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_attention_steps(
    trace: Trace, layer: int = 0, head: int = 0, steps: Sequence[int] | None = None, tokens: Sequence[str] | None = None
) -> Figure:
    """One layer / head over several steps: the context columns grow as tokens are accepted."""
    steps = list(range(len(trace))) if steps is None else list(steps)
    steps = [s for s in steps if trace.activations[s].get(f"draft.layers.{layer}.self_attn.hook_pattern") is not None]
    fig, axes = _subplots((3.0 * len(steps) + 0.8, 3.0), 1, len(steps), squeeze=False)
    for ax, s in zip(axes[0], steps):
        r = trace.records[s]
        im = _heatmap(
            ax,
            trace.attention(s, layer)[head].float().numpy(),
            r,
            trace.context_columns(s),
            tokens,
            f"step {s}: τ = {r.acceptance_length}",
            annotate=False,
        )
    fig.suptitle(f"draft layer {layer}, head {head}, step by step (white line: context | block)", fontsize=10)
    fig.tight_layout()
    fig.colorbar(im, ax=axes[0].tolist(), fraction=0.02, label="attention weight")
    return fig


def plot_attention_compare(
    traces: dict[str, Trace],
    step: int = 0,
    layers: Sequence[int] = (0,),
    head: int = 0,
    tokens: Sequence[str] | None = None,
    last_keys: int = 28,
) -> Figure:
    """The same head of several drafts side by side (columns), one row per layer, at one step (at
    step 0 they see the same prompt and x_0, so only their weights differ); the last `last_keys`
    key columns; rows of each map = the block."""
    fig = Figure(figsize=(5.2 * len(traces) + 0.8, 3.6 * len(layers)), layout="constrained")
    axes = fig.subplots(len(layers), len(traces), squeeze=False)
    for r, layer in enumerate(layers):
        for ax, (name, trace) in zip(axes[r], traces.items()):
            record = trace.records[step]
            weights = trace.attention(step, layer)[head].float().numpy()
            cut = max(0, weights.shape[1] - last_keys)
            shown = dataclasses.replace(record, k_position_ids=record.k_position_ids[cut:])
            im = _heatmap(
                ax,
                weights[:, cut:],
                shown,
                trace.context_columns(step) - cut,
                tokens,
                f"{name} · layer {layer} · head {head} (step {step}: τ = {record.acceptance_length})",
                annotate=False,
            )
    fig.colorbar(im, ax=axes, fraction=0.02)
    fig.suptitle("draft attention (white line: context | block); rows = block positions", fontsize=10)
    return fig


def plot_cache_timeline(trace: Trace) -> Figure:
    """Cache lengths at each event of each step: before, after draft/verify (grown), after crop."""
    fig, ax = _subplots((max(6, 1.2 * len(trace)), 3.2))
    x, tgt, drf, ticks = [], [], [], []
    for i, r in enumerate(trace.records):
        base = 3 * i
        x += [base, base + 1, base + 2]
        tgt += [r.target_cache_before, r.target_cache_after_verify, r.target_cache_after]
        drf += [r.draft_cache_before, r.draft_cache_after_draft, r.draft_cache_after]
        ticks += [(base, f"step {i}"), (base + 1, "pass"), (base + 2, "crop")]
    # after each pass both caches hold start + L_q positions: the target's hollow circles ring the draft's squares
    ax.step(x, drf, where="post", color=CONTEXT_COLOUR, marker="s", markersize=5, label="draft cache", zorder=2)
    ax.step(x, tgt, where="post", color=BLOCK_COLOUR, marker="o", markersize=9, markerfacecolor="none",
            markeredgewidth=1.5, label="target cache", zorder=3)  # fmt: skip
    ax.set_xticks([t for t, _ in ticks], [lbl for _, lbl in ticks], fontsize=7, rotation=90)
    ax.set_ylabel("cached positions")
    ax.set_title(
        "KV cache lengths. draft: + L_c + L_q in its pass, cropped to start;\n"
        "target: + L_q in the verify, cropped to the τ + 1 tokens it keeps (fewer where the run's length ends)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_acceptance(trace: Trace) -> Figure:
    """τ per step (bar) and the histogram of τ."""
    taus = [r.acceptance_length for r in trace.records]
    gamma = max((len(r.draft_tokens) for r in trace.records), default=1)
    fig, (a, b) = _subplots((9, 3), 1, 2)
    a.bar(range(len(taus)), taus, color=CONTEXT_COLOUR)
    a.set_xlabel("decode step")
    a.set_ylabel("accepted draft tokens τ")
    a.set_ylim(0, gamma + 0.5)
    mean = sum(r.produced for r in trace.records) / max(len(taus), 1)
    a.set_title(f"τ per step: mean τ + 1 = {sum(taus) / max(len(taus), 1) + 1:.2f}, committed {mean:.2f}", fontsize=9)
    b.hist(taus, bins=np.arange(-0.5, gamma + 1.5, 1.0), color=BLOCK_COLOUR, rwidth=0.85)
    b.set_xlabel("τ")
    b.set_ylabel("steps")
    b.set_title("histogram of τ", fontsize=9)
    b.set_xticks(range(gamma + 1))
    for axis in (a.yaxis, b.yaxis):  # counts: no 0.5 steps or 1.5 tokens on the ticks
        axis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    return fig


def plot_rope_alignment(record: StepRecord) -> Figure:
    """Q rows use the last L_q positions of the table; K columns use all L_c + L_q."""
    q_pos, k_pos = record.q_position_ids, record.k_position_ids
    fig, ax = _subplots((max(5, 0.5 * len(k_pos) + 1.5), 2.4))
    ctx = len(k_pos) - len(q_pos)
    ax.scatter(
        k_pos, [1] * len(k_pos), s=120, c=[CONTEXT_COLOUR] * ctx + [BLOCK_COLOUR] * len(q_pos), marker="s", zorder=3
    )
    ax.scatter(q_pos, [0] * len(q_pos), s=120, c=BLOCK_COLOUR, marker="o", zorder=3)
    for p in q_pos:
        ax.plot([p, p], [0, 1], color="grey", linestyle=":", zorder=1)
    ax.set_yticks([0, 1], ["Q (block)", "K (context | block)"])
    ax.set_xticks(k_pos)
    ax.set_xlabel("RoPE position id")
    ax.set_ylim(-0.6, 1.6)
    ax.set_title(f"RoPE alignment, step {record.step}: Q takes cos/sin[-{len(q_pos)}:], K all {len(k_pos)}", fontsize=9)
    fig.tight_layout()
    return fig


def plot_candidate_lattice(trace: Trace, step: int = 0, tokens: Sequence[str] | None = None) -> Figure:
    """DFlash 2's selector at one step: proposal positions 1..γ (columns) × their M candidates (rows, by the
    draft logit z, so the top row is the argmax, what DFlash 1 would propose), each cell coloured by the score
    the path compared, z + pair (the pair term with the predecessor the path chose), and labelled with its token.
    The path is boxed; where it leaves the top row it left the argmax. The proposals the target accepted (the
    first τ) are filled in red and ticked."""
    acts, record, name = trace.activations[step], trace.records[step], "draft.candidate_selector."
    if name + "hook_candidates" not in acts:
        raise ValueError(f"step {step} holds no candidate selector tensors (a DFlash 2 draft, traced)")
    candidates = acts[name + "hook_candidates"].numpy()  # (γ, M)
    unary = acts[name + "hook_unary"].float().numpy()  # (γ, M): z
    scores = unary + acts[name + "hook_pair"].float().numpy()  # (γ, M): z + pair
    order = np.argsort(-unary, axis=1, kind="stable")  # by z, the argmax first, per position
    candidates, scores = np.take_along_axis(candidates, order, 1), np.take_along_axis(scores, order, 1)
    gamma, k = scores.shape
    fig, ax = _subplots((1.1 * gamma + 2.9, 0.45 * k + 1.9))
    image = ax.imshow(scores.T, cmap="viridis", aspect="auto")
    bright = (scores - scores.min()) > 0.7 * max(float(np.ptp(scores)), 1e-9)  # viridis' yellow end: black text
    for t in range(gamma):
        r = int(np.flatnonzero(candidates[t] == record.draft_tokens[t])[0])  # the path's row
        accepted = t < record.acceptance_length
        if accepted:
            ax.add_patch(Rectangle((t - 0.5, r - 0.5), 1, 1, color=BLOCK_COLOUR, alpha=0.85, zorder=2))
        ax.add_patch(Rectangle((t - 0.46, r - 0.46), 0.92, 0.92, fill=False, lw=3, edgecolor="white", zorder=3))
        for row in range(k):
            c = int(candidates[t, row])
            label = tokens[c] if tokens is not None and c < len(tokens) else str(c)
            ticked = accepted and row == r
            ax.text(t, row, f"✓ {label}" if ticked else label, ha="center", va="center", fontsize=7, zorder=4,
                    color="black" if bright[t, row] and not ticked else "white",
                    fontweight="bold" if row == r else "normal")  # fmt: skip
    ax.set_xticks(range(gamma), [f"d{t + 1}" for t in range(gamma)])
    ax.set_yticks(range(k), ["1: argmax"] + [str(row + 1) for row in range(1, k)])
    ax.set_xlabel("proposal position")
    ax.set_ylabel("candidate, by draft logit z")
    ax.set_title(
        f"step {step}: the path (boxed) through the candidates; top row: the argmax of z;\n"
        f"accepted by the target (τ = {record.acceptance_length}): red, ✓",
        fontsize=9,
    )
    fig.colorbar(image, ax=ax, label="score z + pair")
    fig.tight_layout()
    return fig


def save_figure(fig: Figure, path: str | Path, dpi: int = 110) -> Path:
    """PNG without a timestamp or version string, so a rerun writes the same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, metadata={"Software": None})
    return path
