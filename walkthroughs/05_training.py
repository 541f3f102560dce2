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
# # 05 · Why a block can be drafted at once: training the toy draft
#
# Notebooks 01 to 04 used drafts that arrived trained. Here we train one, on the toy target, in view: the data,
# the objective computed by hand, the loss going down, and the acceptance before and after.
#
# **Diffusion, and what DFlash keeps of it.** An autoregressive language model learns $p(x_{t+1} \mid x_{\le t})$
# and writes one token per pass. A *masked diffusion* language model learns to fill in: given a sequence with some
# positions replaced by a mask token, it predicts every masked token at once from what is not masked, and it
# writes by starting from all masks and unmasking over several passes (each pass is one "denoising" step).
# *Block diffusion* does that one block at a time, left to right: blocks follow each other autoregressively, the
# positions inside a block are filled together, attending each other both ways.
#
# A DFlash draft is a block-diffusion model cut to a single pass. Its block is $[x_0, \text{mask}, …,
# \text{mask}]$, and it fills every mask in one forward pass. Two things make one pass enough:
#
# - the **context** it reads is not its own guesses but the target's hidden states (notebook 01's KV injection):
#   the target has already read the text, and its middle layers carry what it expects next;
# - a wrong guess costs **acceptance only**: the target verifies every proposal (notebook 02), so a rough
#   one-pass draft is still lossless, and a good one saves target passes.
#
# **The objective** (the paper's, `dflash_ref/training/recipe.py`): on text the target wrote itself (so the draft
# learns what the target will accept), pick anchors $a_j$ in the response; block $j$ is $[x_{a_j}, \text{mask},
# …]$ at positions $a_j … a_j + b − 1$, it sees the context features of the positions before $a_j$ (exactly what
# inference has when $x_{a_j}$ is the last committed token), and it must predict $x_{a_j + k}$ at block position
# $k = 1 … b − 1$:
#
# $$\mathcal{L} = \frac{1}{m \sum_k w_k} \sum_{j=1}^{m} \sum_{k=1}^{b-1} w_k \,\mathrm{CE}(z_{j,k},\, x_{a_j+k}),
# \qquad w_k = e^{-(k-1)/\gamma},$$
#
# early positions weighted most, since a step is only as long as its first wrong proposal allows.
#
# **Needs**: the `notebooks` extra only. **Knobs**: the next cell.

# %% tags=["parameters"]
block_size = 4  # b, 2 to 8 (the shipped toy draft of that size is shown beside the one trained here)
steps = 300  # optimiser steps, 1 to 3000 (the shipped toy drafts had 1500)
prompts = 256  # training prompts the target answers, 16 to 1024 (the shipped toy drafts had 1024)
figures = "../figures"  # where the figures are written

# %%
# %matplotlib inline
import math

import torch
from tqdm.auto import tqdm

from dflash_ref.tour.demo import TOY_BLOCK_SIZES, VOCAB, decode, demo_models
from dflash_ref.tour.exercises import check
from dflash_ref.tour.knobs import knob
from dflash_ref.tour.source import show_source
from dflash_ref.tour.toy_drafts import BATCH, GAMMA, toy_data, train_toy_draft
from dflash_ref.tour.toy_training import (
    acceptance,
    evaluation_blocks,
    fresh_prompts,
    loss_by_position,
    plot_acceptance_by_position,
    plot_block_sizes,
    plot_training,
)
from dflash_ref.trace.plots import save_figure

torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
knob("steps", steps, range(1, 3001))
knob("prompts", prompts, range(16, 1025))
target, draft = demo_models(block_size=block_size)  # the toy target, and a random draft to train
_, shipped = demo_models(block_size=block_size, trained=True)  # the one trained for 1500 steps, for comparison

# %% [markdown]
# ## 1. The data: the target writes its own continuations
#
# Random prompts of 1 to 5 toy words; the target continues each greedily for 24 tokens. These sequences, and the
# target's features at every position, are all the training sees.

# %%
with torch.no_grad():
    data = toy_data(target, prompts)
for ids, prompt_len in data[:4]:
    words = decode(ids[0])
    print(" ".join(words[:prompt_len]), " ⟶ ", " ".join(words[prompt_len:]))

# %% [markdown]
# ## 2. One training example, by hand
#
# Take one sequence and a few anchors. Each anchor's block is the anchor token and b − 1 masks; the labels are the
# tokens that follow it. All the blocks go through the draft in **one** pass: block j's queries see the context
# keys of positions before $a_j$ and the keys of their own block, nothing of the other blocks (the mask below;
# inference, with its cache, sees exactly that).

# %%
from dflash_ref.training.features import target_features  # noqa: E402
from dflash_ref.training.recipe import block_mask, dflash_loss, loss_weights, training_logits  # noqa: E402

ids, prompt_len = data[0]
anchors = torch.tensor([prompt_len, prompt_len + 7, prompt_len + 14])  # three anchors in the response
features = target_features(target, ids, draft.target_layer_ids)  # (1, T, k·d): the context features
for a in anchors.tolist():
    block = [VOCAB[int(ids[0, a])]] + ["<mask>"] * (block_size - 1)
    labels = decode(ids[0, a + 1 : a + block_size])
    print(f"anchor {a:>2}: block {block} → labels {labels}; context: positions 0..{a - 1}")
mask = block_mask(anchors, block_size, ids.shape[1])  # (m·b, T + m·b): which keys each query sees
print("the mask: rows the m·b block queries, columns the T context keys then the m·b block keys")
print("\n".join("".join("█" if seen else "·" for seen in row.tolist()) for row in mask))

# %% [markdown]
# The loss on these blocks, by hand: the cross-entropy of each block position's logits against its label,
# $w_k$-weighted, against the library's `dflash_loss`. (Two float32 sums of n terms differ by at most about
# n · 2⁻²⁴ of their size: the bound the check allows.)

# %%
weights = loss_weights(block_size, GAMMA)  # (b − 1,): w_k = exp(−(k − 1)/γ)
with torch.no_grad():
    logits, labels = training_logits(draft, target, ids, features, anchors)  # (m, b − 1, V), (m, b − 1)
    log_p = logits.double().log_softmax(dim=-1)  # (m, b − 1, V)
    ce = -log_p.gather(-1, labels[..., None])[..., 0]  # (m, b − 1): −log p(label)
    mine = float((ce * weights).sum() / (len(anchors) * weights.sum()))
    library = float(dflash_loss(logits, labels, weights))
terms = logits.numel()
assert abs(mine - library) <= terms * 2**-24 * max(1.0, abs(library)), (mine, library)
print(f"w_k = {weights.tolist()}")
print(f"loss by hand {mine:.6f}, the library's {library:.6f} (an even guess: ln V = {math.log(len(VOCAB)):.2f})")
show_source(dflash_loss)

# %% [markdown]
# ## 3. Training, in view
#
# `train_toy_draft` is the recipe's loop: each step draws BATCH sequences, fresh anchors in each, one pass per
# sequence, AdamW with a warm-up and a cosine decay. It starts from the random draft above.

# %%
blocks = evaluation_blocks(data, block_size)  # a fixed set of blocks to measure each position's loss on
ce_before = loss_by_position(draft, target, blocks)
bar = tqdm(total=steps, desc="   training", unit="step", ncols=100)


def progress(step, loss):
    bar.update(1)
    if step % max(1, steps // 6) == 0 or step == steps - 1:
        bar.write(f"   step {step:>4}: loss {loss:.3f}")


losses = train_toy_draft(target, draft.train(), data, steps, on_step=progress)
bar.close()
ce_after = loss_by_position(draft, target, blocks)
ce_shipped = loss_by_position(shipped, target, blocks)
print(f"{steps} steps of {BATCH} sequences: loss {losses[0]:.3f} → {losses[-1]:.3f}")
for k, (b, a, s) in enumerate(zip(ce_before, ce_after, ce_shipped), 1):
    print(f"   block position {k}: cross-entropy {b:.2f} before, {a:.2f} after, the shipped draft {s:.2f}")

# %%
figure = plot_training(losses, ce_before, ce_after, ce_shipped)
save_figure(figure, f"{figures}/05_training.png")
figure

# %% [markdown]
# ## 4. Acceptance, before and after
#
# Greedy speculative decoding of fresh prompts, 16 tokens each, with the random start, the draft just trained,
# and the shipped toy draft of this block size: τ + 1 per step, and per block position the share of steps whose
# proposals were all accepted up to there.

# %%
prompts_fresh = fresh_prompts()
_, random_start = demo_models(block_size=block_size)  # the random start again
runs = {"random (before)": acceptance(random_start, target, prompts_fresh), f"after {steps} steps": acceptance(
    draft, target, prompts_fresh), "shipped (1500 steps)": acceptance(shipped, target, prompts_fresh)}  # fmt: skip
for name, run in runs.items():
    shares = ", ".join(f"{share:.2f}" for share in run.by_position)
    print(f"{name:>22}: τ + 1 = {run.tokens_per_step:.2f} over {len(run.taus)} steps; accepted up to d1…: {shares}")
figure = plot_acceptance_by_position(runs)
save_figure(figure, f"{figures}/05_acceptance_by_position.png")
figure

# %% [markdown]
# **Why one pass can propose a block.** Every mask of the block has the same input embedding; what tells the
# positions apart is their RoPE position and what they read: the injected context, which holds the target's own
# reading of the text, and each other (attention inside the block goes both ways). Trained, the draft has learnt
# to read from the context what the target will write next, one, two, three positions ahead, in a single pass.
# The lines above show how far that reaches: the cross-entropy grows with the block position (the further ahead,
# the less the context settles), and the acceptance falls with it, since a step keeps its proposals only up to the
# first wrong one.
#
# ## 5. What a longer block buys
#
# The same fresh prompts with the shipped toy draft of every block size (each trained on blocks of its own size:
# a draft trained on blocks of 4 never learnt a fifth position). A longer block can commit more per step, but only
# as far as its later positions are right.

# %%
by_size = {b: acceptance(demo_models(block_size=b, trained=True)[1], target, prompts_fresh) for b in TOY_BLOCK_SIZES}
for b, run in by_size.items():
    print(f"block size {b}: τ + 1 = {run.tokens_per_step:.2f} tokens per step")
figure = plot_block_sizes(by_size)
save_figure(figure, f"{figures}/05_block_sizes.png")
figure

# %% [markdown]
# Each step costs one draft pass and one target pass whatever the block size (on a GPU a longer block is nearly
# free until the hardware is busy), so tokens per step is what the block buys; a longer block also makes the
# target verify more positions per pass, which costs more where the target's pass is not free.
#
# ## Exercise
#
# **Exercise 10. Predict, then run.** The loss weights $w_k = e^{-(k-1)/\gamma}$ with γ = 4: by how much, rounded to
# two decimals, is block position 4 weighted against position 1? (A number.)

# %%
your_answer = None  # e.g. 0.5

check(
    your_answer,
    round(float(loss_weights(8, GAMMA)[3] / loss_weights(8, GAMMA)[0]), 2),
    "w_4 / w_1 = e^{−3/4} ≈ 0.47: a step is only as long as its first wrong proposal, so early positions count most.",
)
