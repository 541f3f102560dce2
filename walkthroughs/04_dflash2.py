# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · DFlash 2: a convolution inside the block, a path through candidates
#
# The seed's example again: the prompt "the cat sat", **block size 4**, the same tiny target as
# notebooks 01 and 02. The draft is a **DFlash 2** draft of the same width: DFlash 1's draft plus
# two things.
#
# 1. Around each sublayer (attention, MLP) of every draft layer, a **grouped dynamic causal
#    convolution** over the block's positions.
# 2. The proposals come from a **candidate selector**: the top-K tokens of the draft logits at every
#    position, then a left-to-right path through them in which each choice is scored with the one
#    chosen before it.
#
# Here: K = 3 taps, channels in groups of 4 (2 groups of the 8), selector rank 4, top 4 candidates.
# (Public ports read K = 2, groups of 16, rank 256 and the top 16 from the released DFlash 2 drafts'
# configs; K = 3 lets the restart show on two positions.)
# Every tensor below is read from the library's hook points of one real `spec_generate` run
# (`dflash_ref.tour.dflash2`, which also writes this notebook's figures to `figures/`).

# %%
# %matplotlib inline
import numpy as np
import torch

from dflash_ref.hooks import hook_points
from dflash_ref.tour.demo import VOCAB, decode
from dflash_ref.tour.dflash2 import (
    block_labels,
    conv_lag_norms,
    dflash2_example,
    path_vs_argmax,
    plot_conv_positions,
)
from dflash_ref.trace.plots import plot_candidate_lattice

torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
ex = dflash2_example()
trace, draft, record = ex.trace, ex.draft, ex.trace.records[0]
trace

# %% [markdown]
# The new weights, with their shapes: per convolution a `base_kernel` (2, K, d), the learned taps
# $w^0$ (before the sublayer) and $w^1$ (after it), and a `kernel_projection` $W_a$ (d → 2·K·G) that
# makes the dynamic taps from the sublayer's input; one selector with two codebooks (V, r) and a
# `hidden_projection` P (r, d).

# %%
for name, p in draft.named_parameters():
    if "conv" in name and name.startswith("layers.0.") or name.startswith("candidate_selector."):
        print(f"{name:<46} {tuple(p.shape)}")

# %% [markdown]
# ## 1. The convolution
#
# With x = RMSNorm(H) the sublayer's input over the block's positions t = 0..3 and g the group of a
# channel:
#
# $$u_t = \sum_{j<K} (w^0_j + a^0_{t,j,g}) \odot x_{t-j}, \qquad
# y_t = \sum_{j<K} (w^1_j + a^1_{t,j,g}) \odot f(u)_{t-j}, \qquad a_t = W_a x_t,$$
#
# and $x_{t-j} = 0$ when $t - j < 0$: the convolution starts again at every block. The layer adds
# $y$ to the residual, where DFlash 1 adds $f(x)$. Layer 0's hook points:

# %%
[name for name in hook_points(draft) if name.startswith("draft.layers.0.") and "conv" in name]

# %%
taps = trace["draft.layers.0.attention_conv.hook_taps", 0]
print("dynamic taps a_t, (L_q, prepare | finish, K, G):", tuple(taps.shape))
print("block:", block_labels(ex, 0))

# %% [markdown]
# Each sum has K terms, one per lag j. `conv_lag_norms` computes them with the library's own
# `convolve`, one lag at a time, checks that they add up to the recorded `hook_prepared` and
# `hook_finished`, and returns the norm of each (rows: block positions, columns: lags).

# %%
norms = conv_lag_norms(ex, step=0)
for name, n in norms.items():
    print(name)
    print(torch.from_numpy(n))

# %% [markdown]
# Block position 0 (the anchor x_0, the last committed token) gets nothing from lags 1 and 2:
# those reach before the block, so their terms are exactly zero. Position 1 sees itself and the
# anchor, positions 2 and 3 three positions each. The context never enters the convolution (it enters
# only through attention), so no convolution state is carried from one step to the next.
#
# In the first convolution of layer 0 the three masks have the same input x (the mask embedding)
# and hence the same dynamic taps: their lag-0 terms are equal, and so are the lag-1 terms of
# positions 2 and 3. What tells the masks apart there is only how far back the block start is.

# %%
for step in range(len(trace.records)):
    for m in conv_lag_norms(ex, step).values():
        before = np.arange(m.shape[1])[None, :] > np.arange(m.shape[0])[:, None]  # (L_q, K): t − j < 0
        assert (m[before] == 0).all() and (m[~before] > 0).all()
print("every step: each term reaching before the block is 0, every other term is not")

# %%
plot_conv_positions(norms, block_labels(ex, 0))

# %% [markdown]
# ## 2. The candidate selector
#
# At proposal position t = 1..3, from the draft logits $z_t$ and the draft's final hidden $h_t$:
# the K = 4 tokens of largest $z_t$ are the candidates $c_{t,k}$ (this K counts candidates, not the
# convolution's taps), and
#
# $$\mathrm{score}_{t,k} = z_{t,k} + \langle E_\mathrm{pred}(x_{t-1}) \odot P h_t,\ E_\mathrm{succ}(c_{t,k}) \rangle,$$
#
# with $x_0$ the anchor. Greedy decoding takes the best score at each position, left to right, so
# each proposal depends on the one chosen before it. The lattice of step 0: columns are the
# proposal positions, rows the candidates by score, the chosen path boxed, the accepted prefix red.

# %%
acts = trace.activations[0]
s = "draft.candidate_selector."
for t in range(len(record.draft_tokens)):
    cands, unary, pair = (acts[s + h][t].tolist() for h in ("hook_candidates", "hook_unary", "hook_pair"))
    row = ", ".join(f"{VOCAB[c]}: {u:.2f} {p:+.2f}" for c, u, p in zip(cands, unary, pair))
    print(f"d{t + 1}  z + pair  [{row}]  → {VOCAB[record.draft_tokens[t]]!r}")

# %%
plot_candidate_lattice(trace, step=0, tokens=VOCAB)

# %% [markdown]
# ## 3. The chosen path against the argmax of the draft logits
#
# With K = 1 the path would be the argmax (DFlash 1's proposal). With K = 4 the pair term can move a
# choice off the argmax, and a changed choice changes the next position's pair term too.

# %%
for step, (argmax, path) in enumerate(path_vs_argmax(ex)):
    moved = [i + 1 for i, (a, p) in enumerate(zip(argmax, path)) if a != p]
    print(f"step {step:>2}: argmax {decode(argmax)}  path {decode(path)}  moved at {moved or '-'}")

# %% [markdown]
# ## 4. Acceptance, next to a DFlash 1 draft
#
# The same target, the same prompt, greedy: the DFlash 1 draft of notebooks 01 and 02 and this
# DFlash 2 draft. Both are **untrained** (random weights), and there is no oracle here: notebook 02
# replaced the proposals to show the loop's mechanics, but here the proposals are what is compared.
# So the acceptance lengths are those of random weights, mostly zero, and they say nothing about
# trained DFlash 2 drafts. Either way the output is the target's own (checked in `dflash2_example`).

# %%
for name, out in (("DFlash 2", ex.output), ("DFlash 1", ex.dflash1)):
    print(
        f"{name}: τ per step {out.acceptance_lengths}, {out.num_target_passes} target passes for "
        f"{out.num_output_tokens} tokens"
    )
print("output:", " ".join(decode(ex.output.output_ids)))
print(
    "equal to the target's own greedy output:",
    torch.equal(ex.output.output_ids, ex.reference.output_ids)
    and torch.equal(ex.dflash1.output_ids, ex.reference.output_ids),
)

# %% [markdown]
# ## 5. A trained DFlash 2 draft on a real pair
#
# Everything above ran on random weights. The draft shipped for SmolLM2-135M
# (`dflash_ref/drafts/smollm2_dflash2`, trained on a CPU: `figures/training/README.md`) has the same
# parts at working sizes: K = 3 taps, channels in groups of 16, selector rank 32, the top 8
# candidates, proposals among its 11625-token draft vocabulary. `trained_dflash2_example` decodes
# three held-out prompts of the training templates and three written in other styles, greedily;
# it traces the selector on the first and, at every step of all six, sets the path beside the
# argmax of the same draft logits (what a DFlash 1 head on this draft would propose). The draft
# logits do not depend on the path, and the output is the target's own greedy decoding, so how
# far the argmax would have been accepted can be read off the output without running it.
# A position is *decisive* when the path was right up to it: there the step's length was decided.

# %%
from dflash_ref.tour.trained_dflash2 import first_moved_step, tell_trained_dflash2, trained_dflash2_example

trained = trained_dflash2_example()
tell_trained_dflash2(trained)

# %% [markdown]
# The lattice of the first step whose path leaves the argmax somewhere, with the real tokens:

# %%
plot_candidate_lattice(trained.trace, step=first_moved_step(trained.trace), tokens=trained.tokens)

# %% [markdown]
# Every step of that run, to step through: the lattice with the path taken and the argmax, the
# proposals against the posterior, and the draft's attention over the real tokens.

# %%
from dflash_ref.tour.story import write_viewer
from dflash_ref.viewer import show

show(write_viewer(trained.trace, "../figures", "04_dflash2_smollm2"))

# %% [markdown]
# Reading it: in the printed step, after the accepted " human" the pair term lifts " body" (+4.9)
# over the argmax " is" (−4.1), a pairing the selector learned ("human body"); the target wanted
# " heart", the second by score, so this step ends there either way. Over the six prompts the
# target's token is among the 8 candidates at only about half of the decisive positions, which
# caps what any path can gain, and here the path and the argmax come out about even. Over the 16
# prompts and 96 tokens of `python -m dflash_ref bench trained` the same draft's path is accepted
# 0.520 times per step against the argmax's 0.483 (+7.7 %; `figures/bench/bench.md`). The
# selector helps a little, and the bound is recall: the draft logits must first put the right
# token among the candidates.
