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
# # 01 · KV injection, tensor by tensor
#
# The seed's example: a **3-token prompt** and **block size 4**. The context occupies positions
# 0..2, the block positions 3..6. We run one real decode step of `dflash_ref.spec_generate` on tiny
# deterministic models and read every tensor from the library's **hook points**: nothing below
# recomputes DFlash by hand.
#
# Target: 6 layers, hidden 8, 2 query heads sharing 1 KV head (GQA), head_dim 4, a 16-word vocabulary.
# Draft: 2 layers, block size 4. Both have random weights (`dflash_ref.tour.demo`).

# %%
# %matplotlib inline
import torch

from dflash_ref import build_target_layer_ids
from dflash_ref.hooks import hook_points
from dflash_ref.tour.demo import VOCAB, decode
from dflash_ref.tour.story import kv_injection_example

torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
ex = kv_injection_example()
trace, draft, record = ex.trace, ex.draft, ex.trace.records[0]
trace

# %% [markdown]
# Every stage has a named hook point (TransformerLens style). These are the ones of draft layer 0:

# %%
[name for name in hook_points(draft) if name.startswith("draft.layers.0.")]

# %% [markdown]
# ## 1. Layer sampling, and the +1 offset
#
# The draft reads a few target layers, evenly spaced:
# $n = 1$: $[\lfloor L/2 \rfloor]$; $n > 1$: $l_i = \mathrm{round}(1 + i\,(L-4)/(n-1))$.
# `hidden_states[0]` is the embedding output, so layer $l$ is read at `hidden_states[l + 1]`.

# %%
print("tiny target:", build_target_layer_ids(6, 2), "→ hidden_states indices", [i + 1 for i in draft.target_layer_ids])
print("Qwen3-8B (36 layers, 5 draft layers):", build_target_layer_ids(36, 5))

# %% [markdown]
# **Where the seed is wrong.** It says Qwen3-8B has 32 layers and the ids are "about 3, 9, 16, 22, 28".
# Qwen3-8B has **36** layers, and the official rule above gives exactly **[1, 9, 17, 25, 33]**, the
# `target_layer_ids` in z-lab's released `Qwen3-8B-DFlash-b16` config.

# %% [markdown]
# ## 2. Prefill → target_hidden
# The target reads the prompt, emits the first new token $x_0$ (position 3), and its sampled layers
# are concatenated over features: `target_hidden` is (context positions, 2 layers × hidden 8).

# %%
print("prompt:", decode(ex.input_ids), "→ x_0 =", VOCAB[record.block_ids[0]], "at position", record.start)
trace["draft.hook_target_hidden", 0].shape

# %% [markdown]
# ## 3. Context projection: $C = \mathrm{RMSNorm}(W_{fc}\,\mathrm{concat}[h^{(l_1)}, h^{(l_2)}])$
# `fc` (16 → 8, no bias), then `hidden_norm`. Each row of C has root-mean-square 1 (times the norm weight, 1 here).

# %%
fc_out, C = trace["draft.context.hook_fc", 0], trace["draft.context.hook_context", 0]
print("W_fc · target_hidden:", tuple(fc_out.shape))
print("C:", tuple(C.shape))
print(C)
print("rms of each row of C:", C.pow(2).mean(-1).sqrt())

# %% [markdown]
# ## 4. The block and its noise embedding
# The block is $[x_0, \text{mask}, \text{mask}, \text{mask}]$ at positions 3..6, embedded with the
# **target's** `embed_tokens` (the draft has no embedding of its own).

# %%
block = [record.block_ids[0]] + [draft.mask_token_id] * 3
print("block:", [VOCAB[i] for i in block], "positions", record.q_position_ids)
trace["draft.hook_noise_embedding", 0].shape

# %% [markdown]
# ## 5. Q from the block, K and V from context *and* block
# $Q = \mathrm{QNorm}(H W_Q)$, $K = \mathrm{KNorm}(\mathrm{concat}[C W_K, H W_K])$,
# $V = \mathrm{concat}[C W_V, H W_V]$. Shapes are (heads, length, $d_h$), batch dropped.

# %%
a = "draft.layers.0.self_attn."
for hook in ["hook_q", "hook_k_ctx", "hook_k_noise", "hook_v"]:
    print(f"{hook:<13}", tuple(trace[a + hook, 0].shape))
print(
    "K = concat[k_ctx, k_noise] has",
    trace[a + "hook_k_ctx", 0].shape[1],
    "+",
    trace[a + "hook_k_noise", 0].shape[1],
    "=",
    trace[a + "hook_k_rot", 0].shape[1],
    "positions; Q has",
    trace[a + "hook_q", 0].shape[1],
)

# %% [markdown]
# ## 6. RoPE alignment: Q takes the last $L_q$ rows of the tables
# K is rotated with all $L_c + L_q = 7$ positions (0..6); Q only with the last 4 (3..6), so that
# query $i$ and key $j$ see their true relative distance.

# %%
print("K positions:", record.k_position_ids)
print("Q positions:", record.q_position_ids)
q, q_rot = trace[a + "hook_q", 0], trace[a + "hook_q_rot", 0]
print("norm is preserved by the rotation:", torch.allclose(q.norm(dim=-1), q_rot.norm(dim=-1), atol=1e-5))
print("the block's first query (position 3) was rotated:", not torch.allclose(q[:, 0], q_rot[:, 0]))

# %%
from dflash_ref.trace.plots import plot_rope_alignment  # noqa: E402

plot_rope_alignment(record)

# %% [markdown]
# ## 7. The 4 × 7 attention matrix, per head: non-causal
# $\mathrm{softmax}(QK^\top/\sqrt{d_h})$. Every block row sees **every** key, including block
# positions after it (no causal mask inside the block). Columns 0..2 are context, 3..6 the block.

# %%
weights = trace.attention(0, 0)  # (heads, L_q, L_k)
print("shape (heads, L_q, L_c + L_q):", tuple(weights.shape))
print("head 0:\n", weights[0])
print("head 1:\n", weights[1])
print("rows sum to 1:", torch.allclose(weights.sum(-1), torch.ones(weights.shape[:2])))
print("block position 3 attends to position 6 (after it):", float(weights[0, 0, 6]))

# %%
from dflash_ref.trace.plots import plot_attention, plot_attention_grid  # noqa: E402

plot_attention(trace, step=0, layer=0, head=0, tokens=decode(ex.output.output_ids))

# %%
plot_attention_grid(trace, step=0)

# %% [markdown]
# ## 8. Output: the noise embedding's shape, then `[:, 1:]`
# The draft returns (block, hidden) like its input. Position 0 holds the known $x_0$, so only
# positions 1..3 become proposals, through the **target's** `lm_head`.

# %%
out = trace["draft.hook_out", 0]
print("draft output:", tuple(out.shape), "== noise embedding:", tuple(trace["draft.hook_noise_embedding", 0].shape))
print("proposal logits:", tuple(trace["draft.hook_logits", 0].shape), "→", decode(record.draft_tokens))

# %% [markdown]
# ## 9. Verify and accept
# The target scores the block $[x_0, d_1, d_2, d_3]$ in one pass. The acceptance length is
# $\tau = \sum_i \prod_{j \le i} 1[d_j = \text{posterior}_{j-1}]$ (a cumprod), the bonus is
# posterior$_\tau$. With random weights the draft rarely agrees with the target, so τ is usually 0
# here; notebook 02 shows partial and full acceptance.

# %%
print("draft:    ", decode(record.draft_tokens))
print("posterior:", decode(record.posterior))
print("τ =", record.acceptance_length, "· bonus =", VOCAB[record.bonus])
print(
    "caches: target",
    record.target_cache_before,
    "→",
    record.target_cache_after_verify,
    "→ crop",
    record.target_cache_after,
    "· draft",
    record.draft_cache_before,
    "→",
    record.draft_cache_after_draft,
    "→ crop",
    record.draft_cache_after,
)
