"""Part 4 of the walkthrough: DFlash 2 on the seed's example (a 3-token prompt, block size 4).

The same tiny target as parts 1 and 2 (demo.py); a DFlash 2 draft of the same width, with a
convolution of K = 3 taps over groups of 4 channels and a selector of rank 4 over the top 4
candidates. Each sublayer f of a draft layer runs inside two convolutions (dynamic_conv.py):

    u_t = Σ_{j<K} (w⁰_j + a⁰_{t,j,g}) ⊙ x_{t−j}      prepare, x = RMSNorm(H)
    y_t = Σ_{j<K} (w¹_j + a¹_{t,j,g}) ⊙ f(u)_{t−j}   finish, with the taps of the same x

x_{t−j} = 0 before the block's first position, so position 0 (the anchor x_0) sees only itself.
`conv_lag_norms` splits each sum into its K terms (one lag j each), computed by the library's own
`convolve` with the other lags zeroed, and checks that they add up to what the hook points recorded.
The proposals come from the candidate selector (candidate_selector.py), not from the argmax of the
draft logits; `path_vs_argmax` puts both side by side. Both drafts are untrained: the acceptance
lengths printed here are what these random weights give, with no oracle. The shipped, trained
DFlash 2 draft on SmolLM2: trained_dflash2.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from ..decoding import GenerationOutput, generate, spec_generate
from ..dflash2 import DFlash2DraftModel
from ..drafts.random_draft import randomize_
from ..dynamic_conv import convolve
from ..trace import Trace, plots, tracing
from .demo import PROMPT, VOCAB, decode, demo_models, encode

DFLASH2_FIELDS = dict(version=2, conv_kernel_size=3, conv_group_size=4, selector_rank=4, selector_top_k=4)
TRACED = [
    "draft.hook_noise_embedding",
    "draft.hook_logits",
    "draft.candidate_selector.*",
    "draft.layers.*.attention_conv.*",
    "draft.layers.*.mlp_conv.*",
    "draft.layers.*.self_attn.hook_out",
]


@dataclass
class DFlash2Example:
    target: torch.nn.Module
    draft: DFlash2DraftModel
    input_ids: torch.Tensor
    output: GenerationOutput  # the DFlash 2 draft's run, traced
    trace: Trace
    dflash1: GenerationOutput  # the DFlash 1 demo draft on the same target and prompt
    reference: GenerationOutput  # the target's own greedy decoding


def dflash2_models(seed: int = 0, block_size: int = 4):
    """(target, DFlash 2 draft, DFlash 1 draft): demo.py's pair, plus a DFlash 2 draft with the DFlash 1
    draft's config and DFLASH2_FIELDS, its weights N(0, 0.5²) from seed + 1 (norm weights 1)."""
    target, dflash1 = demo_models(seed, block_size)
    draft = DFlash2DraftModel(dataclasses.replace(dflash1.config, **DFLASH2_FIELDS))
    return target, randomize_(draft, seed + 1, norm_jitter=None), dflash1


def dflash2_example(max_new_tokens: int = 16) -> DFlash2Example:
    """The DFlash 2 draft decoding the seed's prompt greedily, traced; the DFlash 1 draft on the same
    context for comparison; both outputs checked equal to the target's own."""
    target, draft, dflash1 = dflash2_models()
    ids = encode(PROMPT)  # (1, 3)
    with tracing(draft, names=TRACED, meta={"vocab": VOCAB}) as trace:
        out = spec_generate(draft, target, ids, max_new_tokens, on_step=trace.on_step)
    one = spec_generate(dflash1, target, ids, max_new_tokens)
    reference = generate(target, ids, max_new_tokens)
    for o in (out, one):
        assert torch.equal(o.output_ids, reference.output_ids), "speculative output must equal AR"
    return DFlash2Example(target, draft, ids, out, trace, one, reference)


def lag_terms(x: torch.Tensor, taps: torch.Tensor, base: torch.Tensor, group_size: int) -> torch.Tensor:
    """term_{j,t} = (w_j + a_{t,j,g}) ⊙ x_{t−j}, one lag at a time through `convolve` with the other
    lags' taps zeroed: x (L, d), taps (L, K, G), base w (K, d) → (K, L, d); Σ_j term_j is the convolution."""
    kernel = base.shape[0]
    terms = []
    for j in range(kernel):
        keep = torch.zeros(kernel, 1, dtype=base.dtype)  # (K, 1): 1 at lag j
        keep[j] = 1.0
        terms.append(convolve(x[None], taps[None] * keep, base * keep, group_size)[0])  # (L, d)
    return torch.stack(terms)  # (K, L, d)


@torch.no_grad()
def conv_lag_norms(ex: DFlash2Example, step: int = 0) -> dict[str, np.ndarray]:
    """‖term_{j,t}‖ (L_q, K) of the two convolutions around layer 0's attention at `step`: prepare
    (x = input_layernorm(noise_embedding), the layer's normed input) and finish (f(u), the attention's
    output). Checks that the terms add up to the recorded u (hook_prepared) and y (hook_finished)."""
    tr, layer, name = ex.trace, ex.draft.layers[0], "draft.layers.0.attention_conv."
    x = layer.input_layernorm(tr["draft.hook_noise_embedding", step])  # (L_q, d)
    taps = tr[name + "hook_taps", step]  # (L_q, 2, K, G)
    attention_out = tr["draft.layers.0.self_attn.hook_out", step]  # (L_q, d)
    norms = {}
    parts = [
        ("prepare (input x = RMSNorm(H))", x, "hook_prepared"),
        ("finish (input Attn(u))", attention_out, "hook_finished"),
    ]
    for half, (title, inp, recorded) in enumerate(parts):
        conv = layer.attention_conv
        terms = lag_terms(inp, taps[:, half], conv.base_kernel[half], conv.group_size)  # (K, L_q, d)
        assert torch.allclose(terms.sum(0), tr[name + recorded, step], atol=1e-5), recorded
        norms[title] = terms.norm(dim=-1).T.numpy()  # (L_q, K)
    return norms


def plot_conv_positions(norms: dict[str, np.ndarray], labels: list[str]) -> Figure:
    """One heatmap per convolution: block positions (rows) × lags j (columns), each cell ‖term_{j,t}‖;
    the cells whose x_{t−j} lies before the block's start are grey: the convolution gives them 0."""
    fig = Figure(figsize=(3.6 * len(norms) + 1.2, 3.0), layout="constrained")
    axes = list(np.atleast_1d(fig.subplots(1, len(norms))))
    vmax = max(float(n.max()) for n in norms.values())
    for ax, (name, n) in zip(axes, norms.items()):
        length, kernel = n.shape
        before = np.arange(kernel)[None, :] > np.arange(length)[:, None]  # (L_q, K): t − j < 0
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
        ax.set_title(f"layer 0 · attention · {name}", fontsize=8)
    axes[0].set_ylabel("block position t", fontsize=8)
    fig.colorbar(image, ax=axes, label="‖(w_j + a_t,j) ⊙ input_(t−j)‖")
    return fig


def path_vs_argmax(ex: DFlash2Example) -> list[tuple[list[int], list[int]]]:
    """Per step: (argmax of the draft logits, the selector's path), both (γ,) token ids."""
    return [
        (a["draft.hook_logits"].argmax(-1).tolist(), a["draft.candidate_selector.hook_path"].tolist())
        for a in ex.trace.activations
    ]


def block_labels(ex: DFlash2Example, step: int) -> list[str]:
    """'position:token' of the block a step drafted: x_0, then its masks."""
    r = ex.trace.records[step]
    return [f"{p}:{VOCAB[r.block_ids[0]]}" if i == 0 else f"{p}:<mask>" for i, p in enumerate(r.q_position_ids)]


HEADER = "\n== Part 4 · DFlash 2: a convolution around each sublayer, a path through candidates =="


def tell_dflash2(ex: DFlash2Example, say: Callable[[str], None] = print, header: bool = True) -> None:
    d, r = ex.draft.config, ex.trace.records[0]
    conv, sel = ex.draft.layers[0].attention_conv, ex.draft.candidate_selector
    if header:
        say(HEADER)
    say(
        f"draft: {d.num_hidden_layers} layers, block_size {d.block_size}; conv K = {d.conv_kernel_size} taps, "
        f"{conv.groups} groups of {d.conv_group_size} channels; selector rank {d.selector_rank}, "
        f"top {d.selector_top_k} candidates"
    )
    say(
        f"   base_kernel {tuple(conv.base_kernel.shape)} = (prepare | finish, K, d); kernel_projection "
        f"{d.hidden_size} → {conv.kernel_projection.out_features} = 2·K·G; codebooks "
        f"{tuple(sel.predecessor_codebook.shape)}, hidden_projection {tuple(sel.hidden_projection.weight.shape)}"
    )
    norms = conv_lag_norms(ex)
    say(f"\n1. The convolution, step 0, layer 0, around attention; block {block_labels(ex, 0)}")
    say(
        "   ‖(w_j + a_t,j) ⊙ input_(t−j)‖ per block position t (rows) and lag j (columns); "
        "lags before the block's start are 0"
    )
    for name, n in norms.items():
        say(
            f"   {name}:\n"
            + "\n".join(
                f"      t={t}: " + "  ".join("     —" if j > t else f"{v:6.3f}" for j, v in enumerate(row))
                for t, row in enumerate(n)
            )
        )
    say("   position 0 sees only itself: every lag j ≥ 1 reaches before the block (the context never enters)")
    say("\n2. The selector at step 0: candidates (top-K of the draft logits) and the path chosen")
    acts = ex.trace.activations[0]
    for t, (cands, unary, pair) in enumerate(
        zip(*(acts["draft.candidate_selector." + h].tolist() for h in ("hook_candidates", "hook_unary", "hook_pair")))
    ):
        cells = ", ".join(f"{VOCAB[c]} {u:.2f}{p:+.2f}" for c, u, p in zip(cands, unary, pair))
        say(f"   d{t + 1}: z + pair [{cells}] → {VOCAB[r.draft_tokens[t]]!r}")
    say("\n3. The chosen path against the argmax of the draft logits, every step:")
    for step, (argmax, path) in enumerate(path_vs_argmax(ex)):
        mark = "same" if argmax == path else f"differs at d{[a != p for a, p in zip(argmax, path)].index(True) + 1}"
        say(f"   step {step:>2}: argmax {decode(argmax)}  path {decode(path)}  ({mark})")
    say("\n4. Acceptance on the same target and prompt (both drafts untrained, no oracle):")
    for name, out in (("DFlash 2", ex.output), ("DFlash 1", ex.dflash1)):
        say(
            f"   {name}: τ per step {out.acceptance_lengths}, {out.num_target_passes} target passes for "
            f"{out.num_output_tokens} tokens"
        )
    say("   both outputs equal the target's own greedy decoding")


def write_figures(ex: DFlash2Example, out: str | Path) -> list[Path]:
    out = Path(out)
    return [
        plots.save_figure(plot_conv_positions(conv_lag_norms(ex), block_labels(ex, 0)), out / "04_conv_positions.png"),
        plots.save_figure(plots.plot_candidate_lattice(ex.trace, 0, tokens=VOCAB), out / "04_candidate_lattice.png"),
    ]
