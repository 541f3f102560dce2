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
# # 01 · KV injection: one draft pass, every equation computed
#
# DFlash drafts the way a **block diffusion** model writes: it is handed a block whose first token x_0 is known and
# whose other positions are masked, [x_0, mask, …, mask], and it fills every mask in one pass, each position
# attending every other one (no causal mask inside the block). A diffusion language model would unmask over many
# such passes; DFlash stops after one, since the target checks every proposal anyway. What makes one pass enough
# is the context it is given: features of the target's own hidden states, injected as keys and values into every
# draft layer (**KV injection**). This notebook computes one such pass; notebook 05 trains a draft and shows what
# it learns.
#
# The seed's example: a **3-token prompt** and **block size 4**, on models small enough that every tensor
# fits on a screen. We run one real decode with `dflash_ref`, record every tensor at the library's **hook
# points** (named identity modules the tensors pass through, as in TransformerLens), and then recompute
# each stage of the draft pass ourselves, in a few lines of plain torch, from the tensor recorded just before
# it. Each recomputation is held to the library's up to float32's rounding, measured in this very run, and the
# library's own code is shown beside it (read from its file as the cell runs). If the library computed a stage
# wrongly, this notebook would stop at that stage's cell.
#
# **Needs**: the `notebooks` extra only (`pip install -e '.[notebooks]'`). Notebook 02 continues with the
# verify, the acceptance and the two crops.
#
# **Knobs**: the next cell. Change them and run everything again: every index below is derived from them
# (try `block_size = 6`, or a prompt of your own made of the words printed two cells down). A value outside the
# range a knob's comment gives is refused, naming the range.

# %% tags=["parameters"]
prompt = "a cat sat"  # words of the toy vocabulary
block_size = 4  # L_q, 2 to 8 (a toy draft is trained for each): the block is x_0 and block_size − 1 masks
layer, head = 0, 0  # the draft layer (0 or 1) and the query head (0 or 1) the figures show
figures = "../figures"  # where the figures are written

# %%
# %matplotlib inline
import torch
from torch.testing import assert_close

from dflash_ref.decoding import spec_generate
from dflash_ref.tour.demo import VOCAB, decode, demo_models, encode
from dflash_ref.tour.exercises import check, exercise, show_answer  # noqa: F401 - show_answer: the learner's to call
from dflash_ref.tour.knobs import knob
from dflash_ref.tour.rounding import measure_rounding
from dflash_ref.tour.source import show_source
from dflash_ref.trace import tracing
from dflash_ref.trace.plots import plot_attention, plot_rope_alignment, save_figure

torch.set_printoptions(precision=3, sci_mode=False, linewidth=120)
torch.set_grad_enabled(False)  # nothing here trains
target, draft = demo_models(block_size=block_size, trained=True)  # refuses a block size with no trained draft
knob("layer", layer, range(draft.config.num_hidden_layers))
knob("head", head, range(draft.config.num_attention_heads))
input_ids = encode(prompt)  # (1, prompt length)
print("vocabulary:", VOCAB)
print("prompt:", decode(input_ids), "→ ids", input_ids.tolist())

# %% [markdown]
# ## Notation (the seed's)
#
# | symbol | meaning |
# |---|---|
# | B | batch: one sequence (the loop decodes one; the draft's forward takes any B) |
# | L, N | the target's layers, the draft's layers |
# | d, d_h | hidden size, head dimension |
# | H_q, H_kv | query heads, key/value heads; **GQA**: H_q / H_kv query heads share each KV head (which ones: §6) |
# | V | vocabulary size |
# | k | target layers the draft reads (layer sampling) |
# | x_0 | the **anchor**: the last committed token, first in the block (the prefill's token at step 0) |
# | L_q | block length: [x_0, mask, …, mask]; its embedding by the target is the **noise embedding** H |
# | γ = L_q − 1 | tokens drafted per step, d_1 … d_γ |
# | L_c | context positions whose features this draft pass injects: the new ones since the last pass |
# | L_k | keys attended: the draft cache's earlier context, then L_c, then L_q |
# | C | the injected context: the sampled target features, projected and normed |
# | posterior | the target's own token at each block position, from one verify pass (notebook 02) |
# | τ | accepted draft tokens in a step; with the **bonus** (the target's token after them) a step commits τ + 1 |
# | τ + 1 | tokens per step: what the paper reports as its "acceptance length" (and also writes τ) |
#
# **Departure from the seed's letters.** The seed writes C with L_c rows and K with L_c + L_q rows: with no
# cache, L_c is the whole context. With the draft's KV cache, a pass computes K and V for the *new* context
# rows only and attends L_k = cached + L_c + L_q keys. At step 0 the cache is empty, so the two meanings agree:
# L_c is the prompt's length here.

# %% [markdown]
# ## The run
#
# The **target** is a 6-layer Qwen3 (random weights, fixed seed). The **draft** is a 2-layer DFlash draft
# trained for it (`dflash_ref/tour/toy_drafts.py`: the paper's recipe on the target's own continuations of
# random prompts, on blocks of this size). One call decodes `block_size` new tokens; `tracing` records every
# hook point of the draft, step by step.

# %%
with tracing(draft, names="draft.*") as trace:
    output = spec_generate(draft, target, input_ids, max_new_tokens=block_size, on_step=trace.on_step)
record = trace.records[0]  # the first decode step: its positions, block, proposals, cache lengths
trace

# %% [markdown]
# **How close is close.** Our recomputations below add and multiply in another order than the library's kernels,
# so they agree with it to float32's rounding and no closer, and how much that is depends on the shapes and on the
# CPU. So it is measured, here: the same run made again with both models in float64 gives the exact values, and ε
# is float32's largest error against them over every tensor of the run. A recomputation passes within 4 ε; a
# library that computes a stage otherwise than its equation misses by orders of magnitude more.

# %%
rounding = measure_rounding(draft, target, input_ids, block_size)
print(rounding)

# %% [markdown]
# The letters with this run's numbers:

# %%
t, d = target.config, draft.config
letters = {
    "B": input_ids.shape[0],
    "L": t.num_hidden_layers,
    "N": d.num_hidden_layers,
    "d": d.hidden_size,
    "d_h": d.head_dim,
    "H_q / H_kv": f"{d.num_attention_heads} / {d.num_key_value_heads}",
    "V": d.vocab_size,
    "k": len(draft.target_layer_ids),
    "L_q": len(record.q_position_ids),
    "γ": len(record.q_position_ids) - 1,
    "L_c (step 0)": record.ctx_len,
    "L_k (step 0)": len(record.k_position_ids),
    "τ (step 0)": record.acceptance_length,
    "τ + 1 (step 0)": record.acceptance_length + 1,
}
for symbol, value in letters.items():
    print(f"{symbol:>13} = {value}")

# %% [markdown]
# The seed's data flow, drawn with this run's shapes (batch first):

# %%
L_c, L_q, k, D, d_h = record.ctx_len, len(record.q_position_ids), len(draft.target_layer_ids), d.hidden_size, d.head_dim
H_q, H_kv, L_k = d.num_attention_heads, d.num_key_value_heads, len(record.k_position_ids)
print(f"""
noise_embedding (1, {L_q}, {D}) ─────────────────────────────────────── H
target_hidden (1, {L_c}, {k}·{D}) ── fc ({k * D}→{D}) ── hidden_norm ── C (1, {L_c}, {D})
position_ids (1, {L_c + L_q}) ── rotary_emb ── cos, sin (1, {L_c + L_q}, {d_h})
      │
      ├─ decoder layer × {d.num_hidden_layers}:  LN → KV injection: Q (1, {H_q}, {L_q}, {d_h}) from H;
      │                         K, V (1, {H_kv}, {L_c}+{L_q}, {d_h}) from [C; H] → softmax(QKᵀ/√{d_h})V → W_O → + H
      │                         LN → SwiGLU MLP ({D}→{d.intermediate_size}→{D}) → +
      ▼
final RMSNorm → (1, {L_q}, {D}) → [:, 1:] → target.lm_head → logits (1, {L_q - 1}, {d.vocab_size}) → d_1 … d_{L_q - 1}
""")

# %% [markdown]
# ## 1. Layer sampling, and the +1 offset
#
# The draft reads k target layers spread evenly over the target's L; unless its config lists them, k = N, the
# draft's own number of layers: $k = 1$: $[\lfloor L/2 \rfloor]$; $k > 1$:
# $l_i = \mathrm{round}(1 + i\,(L-4)/(k-1))$, $i = 0 … k−1$.

# %%
from dflash_ref.layer_sampling import build_target_layer_ids, extract_context_feature

L, N = t.num_hidden_layers, d.num_hidden_layers
by_hand = [L // 2] if N == 1 else [round(1 + i * (L - 4) / (N - 1)) for i in range(N)]
print(f"by hand: {by_hand}   library: build_target_layer_ids({L}, {N}) = {build_target_layer_ids(L, N)}")
assert by_hand == build_target_layer_ids(L, N) == draft.target_layer_ids
show_source(build_target_layer_ids, "if num_draft_layers == 1", "return [round")

# %% [markdown]
# **Two slips of the seed, flagged.** It writes `build_target_layer_ids(num_target_layers, num_hidden_layers)`
# meaning (how many layers to take, the target's depth); the official function and this one take them the other
# way round, (the target's depth L, how many k), and a draft config's `num_target_layers` is the target's
# depth. And it says Qwen3-8B has 32 layers, giving "about 3, 9, 16, 22, 28": Qwen3-8B has **36**, and the
# rule is exact:

# %%
print("Qwen3-8B, 36 layers, a 5-layer draft:", build_target_layer_ids(36, 5))  # z-lab's config: [1, 9, 17, 25, 33]

# %% [markdown]
# The target returns L + 1 hidden states: index 0 is the embedding output, index i the output of the i-th layer.
# Layer ids count from 0, so layer l (the (l + 1)-th layer) is read at `hidden_states[l + 1]`, and `target_hidden`
# is their concatenation over features. We run the target on the prompt ourselves and rebuild what the draft
# received:

# %%
hidden_states = target(input_ids).hidden_states  # L + 1 tensors (1, L_c, d)
target_hidden = torch.cat([hidden_states[i + 1][0] for i in draft.target_layer_ids], dim=-1)  # (L_c, k·d)
print(
    "hidden_states:",
    len(hidden_states),
    "×",
    tuple(hidden_states[0].shape),
    "→ target_hidden",
    tuple(target_hidden.shape),
)
rounding.assert_close(target_hidden, trace["draft.hook_target_hidden", 0], "target_hidden")
show_source(extract_context_feature, "num_layers =")

# %% [markdown]
# ## 2. Context projection: $C = \mathrm{RMSNorm}(W_{fc}\,\mathrm{concat}[h^{(l_1)}, …, h^{(l_k)}])$
#
# `fc` maps k·d → d without bias; `hidden_norm` is an RMSNorm,
# $\mathrm{RMSNorm}(x) = w \odot x / \sqrt{\mathrm{mean}(x^2) + \varepsilon}$.
# C is computed once per pass and shared by every draft layer.

# %%
from dflash_ref.context import project_context
from dflash_ref.rmsnorm import RMSNorm


def rms_norm(x, norm):  # w ⊙ x / √(mean(x²) + ε), over the last dimension
    return norm.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)


fc_out = target_hidden @ draft.fc.weight.T  # (L_c, d)
C = rms_norm(fc_out, draft.hidden_norm)  # (L_c, d)
rounding.assert_close(fc_out, trace["draft.context.hook_fc", 0], "W_fc · target_hidden")
rounding.assert_close(C, trace["draft.context.hook_context", 0], "C")
print("C", tuple(C.shape))
print(C)
show_source(project_context, "projected = fc")
show_source(RMSNorm.forward, "x32 = x.float()")

# %% [markdown]
# ## 3. The block and its noise embedding
#
# The prefill's last logits give x_0, the first new token; the block is $[x_0, \text{mask}, …]$ at the L_q
# positions after the prompt, embedded with the **target's** embedding (the draft has none of its own).

# %%
prefill_logits = target(input_ids).logits[0, -1]  # (V,)
x_0 = int(prefill_logits.argmax())
block = torch.tensor([x_0] + [draft.mask_token_id] * (L_q - 1))  # (L_q,)
# input_embedding_scale: 1 unless the config scales the block's embedding (a field the official code reads)
H = target.model.embed_tokens.weight[block] * draft.config.input_embedding_scale  # (L_q, d)
assert x_0 == record.block_ids[0]
assert_close(H, trace["draft.hook_noise_embedding", 0], rtol=0, atol=0)  # a lookup: exact
print("block", decode(block), "at positions", record.q_position_ids)

# %% [markdown]
# ## 4. Q from the block; K and V from the context *and* the block
#
# In draft layer `layer`, with $x = \mathrm{RMSNorm}(H)$ (its `input_layernorm`):
# $Q = \mathrm{QNorm}(x W_Q)$, $K = \mathrm{KNorm}(\mathrm{concat}[C W_K, x W_K]) = [K_{ctx}; K_{noise}]$,
# $V = \mathrm{concat}[C W_V, x W_V]$. QNorm and KNorm are RMSNorms over each head's d_h features. The
# layer's input H is the noise embedding for layer 0, else the previous layer's output.

# %%
attn = draft.layers[layer].self_attn
H_in = H if layer == 0 else trace[f"draft.layers.{layer - 1}.hook_resid_post", 0]  # (L_q, d)
x = rms_norm(H_in, draft.layers[layer].input_layernorm)  # (L_q, d)


def heads(t, n_heads):  # (L, n_heads · d_h) → (n_heads, L, d_h)
    return t.view(t.shape[0], n_heads, d_h).transpose(0, 1)


q = rms_norm(heads(x @ attn.q_proj.weight.T, H_q), attn.q_norm)  # (H_q, L_q, d_h)
k_ctx = rms_norm(heads(C @ attn.k_proj.weight.T, H_kv), attn.k_norm)  # (H_kv, L_c, d_h)
k_noise = rms_norm(heads(x @ attn.k_proj.weight.T, H_kv), attn.k_norm)  # (H_kv, L_q, d_h)
v = torch.cat(
    [heads(C @ attn.v_proj.weight.T, H_kv), heads(x @ attn.v_proj.weight.T, H_kv)], dim=1
)  # (H_kv, L_c + L_q, d_h)
a = f"draft.layers.{layer}.self_attn."
for name, mine in [("hook_q", q), ("hook_k_ctx", k_ctx), ("hook_k_noise", k_noise), ("hook_v", v)]:
    rounding.assert_close(mine, trace[a + name, 0], name)
    print(f"{name:<13} {tuple(mine.shape)}")
show_source(type(attn).forward, "q_len = hidden_states", "v = self.hook_v")

# %% [markdown]
# ## 5. RoPE with the sliced query
#
# K has L_c + L_q rows, one per position: context first, then the block. Q has only the block's L_q rows. So
# the cos/sin tables are built for all L_c + L_q positions, K takes every row and Q the **last** L_q, so
# that query i and key j see their true distance:
# $\mathrm{rot}(x)_p = x \odot \cos(p\,\theta) + \mathrm{rotate\_half}(x) \odot \sin(p\,\theta)$,
# $\theta_i = \text{base}^{-2i/d_h}$, $\mathrm{rotate\_half}([a, b]) = [-b, a]$.

# %%
from dflash_ref.rope import apply_sliced_rope

k_positions = torch.tensor(record.k_position_ids)  # (L_c + L_q,)
inv_freq = 1.0 / d.rope_theta ** (torch.arange(0, d_h, 2).float() / d_h)  # (d_h / 2,)
angles = torch.cat([k_positions[:, None] * inv_freq] * 2, dim=-1)  # (L_c + L_q, d_h)
cos, sin = angles.cos(), angles.sin()


def rotate_half(t):
    first, second = t.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


k = torch.cat([k_ctx, k_noise], dim=1)  # (H_kv, L_c + L_q, d_h)
k_rot = k * cos + rotate_half(k) * sin
q_rot = q * cos[-L_q:] + rotate_half(q) * sin[-L_q:]  # the last L_q rows: the block's positions
rounding.assert_close(k_rot, trace[a + "hook_k_rot", 0], "K after RoPE")
rounding.assert_close(q_rot, trace[a + "hook_q_rot", 0], "Q after RoPE")
print("K rotated at positions", record.k_position_ids, "· Q at", record.q_position_ids)
wrong = q * cos[:L_q] + rotate_half(q) * sin[:L_q]  # the first L_q rows: a classic porting bug
print(f"Q rotated with the *first* rows instead would differ by up to {float((wrong - q_rot).abs().max()):.3f}")
show_source(apply_sliced_rope, "q_len, k_len")

# %%
save_figure(plot_rope_alignment(record), f"{figures}/01_rope_alignment.png")
plot_rope_alignment(record)

# %% [markdown]
# ## 6. The attention pattern: $\mathrm{softmax}(QK^\top/\sqrt{d_h})$, GQA, and no mask inside the block
#
# H_q query heads share H_kv key/value heads, H_q / H_kv query heads to each. Which ones?
#
# **Exercise 1. Predict, then run.** With H_q = 8 query heads sharing H_kv = 2 KV heads, which KV head does query
# head 5 read? (Two rules are common in code: neighbouring heads share, or heads are dealt round like cards.) The
# cell builds such an attention layer with the library's kernel and finds out by giving each KV head its own
# constant values.

# %%
from dflash_ref.attention import attend

your_answer = None  # a KV head index

q8 = torch.zeros(1, 8, 1, 4)  # (B, H_q, L_q, d_h): one query per head
k2 = torch.zeros(1, 2, 3, 4)  # (B, H_kv, L_k, d_h)
v2 = torch.arange(2.0).view(1, 2, 1, 1).expand(1, 2, 3, 4)  # KV head j's values are all j
read = attend(q8, k2, v2, None, 0.5, explicit=True)[0][0, :, 0, 0]  # what each query head got: its KV head
check(
    your_answer, int(read[5]), "neighbours share: head h reads KV head ⌊h / (H_q/H_kv)⌋ = ⌊5 / 4⌋ = 1, not h mod H_kv."
)

# %% [markdown]
# So query head h reads KV head ⌊h / (H_q/H_kv)⌋. The draft attends **non-causally**: every block position sees
# every key, block positions after it included, so no mask is applied. (The target's verify pass is causal:
# notebook 02 sets the two side by side.)

# %%
group = H_q // H_kv
kv_of_head = torch.arange(H_q) // group  # (H_q,) the KV head each query head reads
scores = q_rot @ k_rot[kv_of_head].transpose(-1, -2) / d_h**0.5  # (H_q, L_q, L_k)
pattern = scores.softmax(dim=-1)  # no mask: every weight is positive
rounding.assert_close(scores, trace[a + "hook_scores", 0], "QKᵀ/√d_h")
rounding.assert_close(pattern, trace[a + "hook_pattern", 0], "the pattern")
assert (pattern > 0).all()
assert read.tolist() == (torch.arange(8) // 4).tolist()  # the rule, on the exercise's 8 heads over 2
print(f"query heads → KV heads: {kv_of_head.tolist()}; pattern (H_q, L_q, L_k) = {tuple(pattern.shape)}")
print(f"head {head}:\n{pattern[head]}")
show_source(attend, "groups =", "return torch.matmul")

# %% [markdown]
# Rows are the block's positions (queries), columns every key: the white line splits context | block. The
# first row is x_0: with no causal mask it puts weight on the masks after it too.

# %%
tokens = decode(torch.cat([input_ids[0], block]))  # the words at positions 0 … L_c + L_q − 1
figure = plot_attention(trace, step=0, layer=layer, head=head, tokens=tokens)
save_figure(figure, f"{figures}/01_attention_step0_layer{layer}_head{head}.png")
figure

# %% [markdown]
# ## 7. The rest of the layer: W_O, the residual, the MLP
#
# $H' = H + W_O\,\mathrm{Attn}$, then $H'' = H' + \mathrm{MLP}(\mathrm{RMSNorm}(H'))$ with the SwiGLU
# $\mathrm{MLP}(x) = W_{down}(\mathrm{SiLU}(W_{gate} x) \odot W_{up} x)$.

# %%
from dflash_ref.draft_layer import DFlashDecoderLayer

attended = pattern @ v[kv_of_head]  # (H_q, L_q, d_h)
attn_out = attended.transpose(0, 1).reshape(L_q, H_q * d_h) @ attn.o_proj.weight.T  # (L_q, d)
resid_mid = H_in + attn_out
mlp = draft.layers[layer].mlp
x2 = rms_norm(resid_mid, draft.layers[layer].post_attention_layernorm)
resid_post = (
    resid_mid
    + torch.nn.functional.silu(x2 @ mlp.gate_proj.weight.T) * (x2 @ mlp.up_proj.weight.T) @ mlp.down_proj.weight.T
)
rounding.assert_close(attn_out, trace[a + "hook_out", 0], "W_O · attention")
rounding.assert_close(resid_mid, trace[f"draft.layers.{layer}.hook_resid_mid", 0], "H + attention")
rounding.assert_close(resid_post, trace[f"draft.layers.{layer}.hook_resid_post", 0], "the layer's output")
show_source(DFlashDecoderLayer.forward, "x = self.input_layernorm")

# %% [markdown]
# ## 8. The output: the noise embedding's shape, then `[:, 1:]` and the target's lm_head
#
# After N layers and the final RMSNorm the draft returns (L_q, d), the shape of its input. Block position 0
# holds x_0, which is known, so only positions 1 … γ become proposals: their logits come from the
# **target's** lm_head (the draft has none), and greedy decoding takes the argmax.

# %%
from dflash_ref.decoding import draft_block

last = trace[f"draft.layers.{d.num_hidden_layers - 1}.hook_resid_post", 0]  # (L_q, d)
out = rms_norm(last, draft.norm)  # (L_q, d)
logits = out[1:] @ target.lm_head.weight.T  # (γ, V): positions 1 … γ
proposals = logits.argmax(dim=-1)  # d_1 … d_γ
rounding.assert_close(out, trace["draft.hook_out", 0], "the final norm")
rounding.assert_close(logits, trace["draft.hook_logits", 0], "the draft logits")
rounding.assert_same_choice(logits, record.draft_tokens, "the proposals")  # the argmax, or a tie rounding broke
print("draft output", tuple(out.shape), "→ logits", tuple(logits.shape), "→ proposals", decode(proposals))
show_source(draft_block, "hidden = draft(", "draft_cache.crop")

# %% [markdown]
# The target's own continuation of the prompt, for comparison (the verify pass in notebook 02 decides how
# many of the proposals are kept):

# %%
print("draft proposes:        ", decode(proposals))
print("the target would write:", decode(output.output_ids[0, input_ids.shape[1] + 1 :]))

# %% [markdown]
# ## Exercises
#
# **Exercise 2. Predict, then run.** With `block_size = 6` and this prompt, what shape does layer 0's attention
# pattern have at step 0, (H_q, L_q, L_k)? Write it below, then run the cell: it decodes again with block size 6.

# %%
your_answer = None  # e.g. (1, 2, 3)

_, draft6 = demo_models(block_size=6, trained=True)
with tracing(draft6, names="draft.layers.0.self_attn.hook_pattern") as trace6:
    spec_generate(draft6, target, input_ids, max_new_tokens=6, on_step=trace6.on_step)
check(
    your_answer,
    tuple(trace6.attention(0, 0).shape),
    f"H_q = {H_q} heads; L_q = 6 rows, the block; L_k = {input_ids.shape[1]} prompt keys + 6 block keys.",
)

# %% [markdown]
# **Exercise 3. Write it: the context projection.** Fill in the function below in plain torch, then run the cell:
# it is held to the library's `project_context` on cases of several shapes (in float64, where a right answer agrees
# to ~1e-15). A miss shows the case, both answers and a hint; `show_answer("context projection")` shows one answer.


# %%
def my_context_projection(target_hidden, fc_weight, norm_weight, eps):
    """target_hidden (L_c, k·d), fc_weight W_fc (d, k·d), norm_weight w (d,), eps ε → C (L_c, d)."""
    ...  # your code: C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)])


exercise("context projection", my_context_projection)

# %% [markdown]
# **Exercise 4. Write it: RoPE with the sliced query.** q (H_q, L_q, d_h), k (H_kv, L_k, d_h), and cos, sin
# (L_k, d_h): one row per key position, context first, the block's L_q positions last. Return (Q rotated, K
# rotated). `show_answer("sliced rope")` shows one answer.


# %%
def my_sliced_rope(q, k, cos, sin):
    """→ (q_rot (H_q, L_q, d_h), k_rot (H_kv, L_k, d_h))."""
    ...  # your code


exercise("sliced rope", my_sliced_rope)
