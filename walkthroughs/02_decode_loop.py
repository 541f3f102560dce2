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
# # 02 · The decode loop: draft, verify, accept, crop, repeat
#
# Each step: take the block $[x_0, \text{mask}, \dots]$ at `start`, draft it in one pass, verify it
# with one target pass, accept the longest matching prefix (cumprod), append the bonus token, crop
# the **target** cache to the accepted length and the **draft** cache back to `start` (the block's
# K/V go, the context stays), and keep only the first $\tau + 1$ new target features as next context.
#
# The draft here is untrained, so its own proposals are almost never right. To show every kind of
# step, an `OracleDraft` replaces its proposals with the target's own continuation, accepting
# exactly τ = 1, 3, 0, 2, 3 tokens in the first five steps (then 0). The draft network still runs
# every pass, so its attention maps and cache are real.

# %%
# %matplotlib inline

from dflash_ref.tour.demo import VOCAB, decode
from dflash_ref.tour.story import decode_loop_example
from dflash_ref.trace.plots import plot_acceptance, plot_attention_grid, plot_attention_steps, plot_cache_timeline

ex = decode_loop_example()
trace = ex.trace
trace

# %%
for r in trace.records:
    print(f"step {r.step}: start {r.start:>2} block {[VOCAB[i] for i in r.block_ids]}")
    print(f"        posterior {[VOCAB[i] for i in r.posterior]} → τ = {r.acceptance_length}, bonus {VOCAB[r.bonus]!r}")
    print(
        f"        new context L_c = {r.ctx_len}; draft cache {r.draft_cache_before} → {r.draft_cache_after_draft}"
        f" → crop {r.draft_cache_after}; target cache {r.target_cache_before} → {r.target_cache_after_verify}"
        f" → crop {r.target_cache_after}"
    )

# %% [markdown]
# The rules, checked on the real run: the draft cache always returns to `start`; the target cache to
# the new start; the next step's new context is exactly the tokens just committed.

# %%
for r, nxt in zip(trace.records, trace.records[1:]):
    assert r.draft_cache_after == r.start
    assert r.target_cache_after == r.start + r.produced == nxt.start
    assert nxt.ctx_len == r.produced
    assert trace.attention(nxt.step, 0).shape[-1] == nxt.draft_cache_before + nxt.ctx_len + len(nxt.q_position_ids)
print("output:", " ".join(decode(ex.output.output_ids)))
print("lossless: equal to the target's own greedy output (checked inside decode_loop_example)")

# %% [markdown]
# ## Cache lengths per step
# Both caches grow by the block during a pass and are cropped back: the draft to `start`, the target
# to `start + τ + 1`.

# %%
plot_cache_timeline(trace)

# %% [markdown]
# ## Acceptance per step

# %%
plot_acceptance(trace)

# %% [markdown]
# ## Attention, step by step
# Layer 0, head 0 of the draft: the context (left of the white line) grows as tokens are accepted;
# the block (right) always has $L_q$ columns.

# %%
plot_attention_steps(trace, layer=0, head=0, tokens=decode(ex.output.output_ids))

# %%
plot_attention_grid(trace, step=1)

# %% [markdown]
# ## Step through it
# The same trace as one HTML file to step through in a browser, offline: a step slider (or ← →),
# layer and head pickers, each weight and its key's position on hover, the proposals against the
# target's posterior, both caches, and the target's own attention at each verify. The walkthrough
# writes it beside its figures; any saved trace gives one (`python -m dflash_ref view TRACE`, or
# `trace.to_html(path)`).

# %%
from dflash_ref.tour.story import write_viewer
from dflash_ref.viewer import show

show(write_viewer(trace, "../figures", "02_decode_loop"))

# %% [markdown]
# ## A trained draft next to a random one (SmolLM2-135M)
# Everything above used an oracle to force acceptance. Here the real thing: SmolLM2-135M-Instruct as
# the target, and two drafts of the same shape — the one trained by `python -m dflash_ref train`
# (shipped with the package) and a random one. The prompt is held out: its topic was never trained on.
# At step 0 both drafts see the same prompt features and the same $x_0$, so the heatmaps differ only
# by the weights. The output is the target's own greedy text either way; only the number of target
# passes differs.

# %%
from dflash_ref.tour.story import tell_trained_vs_random, trained_vs_random_example
from dflash_ref.trace.plots import plot_attention_compare

pair = trained_vs_random_example(max_new_tokens=64)
tell_trained_vs_random(pair)

# %%
plot_attention_compare(pair.traces, step=0, layers=[0, 1], head=0, tokens=pair.tokens)

# %% [markdown]
# The random draft spreads its attention thinly everywhere (softmax of small random scores). The
# trained one has learnt where to look. In layer 0, head 0, the attention stays inside the block: the
# first mask reads almost only the block's first token ("The", the last committed token), the second
# mask reads the first, the last mask the two before it (a chain, the way a mask learns what precedes
# it), and "The" reads the masks after it (attention inside a block goes both ways). In layer 1,
# head 0, "The" and the first two masks read the newline that closes the `<|im_start|>assistant`
# header (the first mask also the prompt's "?"), while the last mask reads the prompt's topic words
# ("heart", then "human"): what the answer is to be about.
# This draft is weak (block position 1 is accepted in about half of the steps on held-out prompts), so
# it saves target passes but is only modestly faster than the target alone on a small CPU: the ratio
# follows the machine's memory bandwidth and its matrix kernels (`python -m dflash_ref bench trained`
# measures it; figures/bench/README.md says how to read it).
