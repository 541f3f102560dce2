"""The stages of the conformance kit and their keys: what each tensor of a bundle is, in the order of the
data's walk (`STAGES`, one `Stage` record each: what the kit knows of it), and `key_for` / `parse_key` /
`walk_order` between a stage and a key.

Keys: `prefill/{target_logits, first_token, layer_ids}` (the prefill's), `step{s}/{name}` (name: a hook point
of the reference, e.g. `draft.layers.0.self_attn.hook_q`, a loop value: `draft_tokens`, `posterior`, ..., the
target's verify logits `target_logits`, or a hybrid target's state after the step's crop:
`target.layers.{l}.linear_attn.recurrent_state`), `output_ids`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage of the kit: everything the kit knows of it, read by every module that needs it (the judge, the
    hints, the page, golden, the variants). Its readers (the patterns its two tensors can show) stay in
    hints.READERS, keyed by `name`: hints reads this table (a stage's causes), so the table holding hints'
    functions would be an import cycle."""

    name: str  # the stage's id, as keys and reports name it
    title: str  # in a report's table
    meaning: str  # what the tensor is, in DFlash's terms
    layout: str  # its shape, as the equations name the axes
    # how a float tensor's axes read on the page: (what picks one slice of a stack, its rows, its columns). Rows
    # and columns named context / block / query / key / proposal are positions of the step, labelled with their
    # tokens; vocab is a token id; anything else is a plain index, named as the layout names it
    axes: tuple[str | None, str, str] | None = None
    # semantic: what DFlash defines; observable: how an implementation lays out its state (variants.py)
    kind: str = "semantic"
    causes: str = ""  # its usual causes, the hint where no reader of hints.READERS speaks
    # what the first shrunk step of a full-then-truncate port still computes as the reference did: its context,
    # before any row of the block (later shrunk steps may follow other proposals, so other contexts)
    block_free: bool = False
    # what a windowed draft cache's first cut step still computes as DFlash: the block's embedding and, in layer
    # 0, its Q, K and V before any attention (the keys it attends: judge._loop_invariants)
    window_free: bool = False
    context_axis: int | None = None  # the axis the step's new context positions run along (V: its first L_c rows)
    restorable: bool = False  # its leading context rows may be restored from a prefix cache (along context_axis)
    draft_pass: bool = False  # a draft pass's own: a step where a port produced none of these ran no draft pass
    # what a teacher-forced port does not compute: the target's stages and the loop's decisions, which DFlash's
    # walk gives it (the draft's proposals are still its own)
    teacher_given: bool = False
    block_axis: tuple[int, int] | None = None  # where the block runs along an axis: (axis, L_q − its length there)
    window_keys_axis: int | None = None  # on a sliding layer, the axis of keys no query sees (a cache may evict)
    unread_rows_axis: int | None = None  # rows that feed nothing downstream (a port may skip them)


# every stage, in the order of the data's walk. Per-layer stages are q..layer_out.
STAGES = (
    Stage(
        name="prefill_logits",
        title="target logits (prefill)",
        meaning=(
            "the target's own logits at the prompt's last position, after its final norm and lm_head "
            "(tied or not, as its config says): what x_0 is taken from"
        ),
        layout="(V,)",
        axes=(None, "row", "vocab"),
        teacher_given=True,
        causes=(
            "the target's own forward at the prompt's last position (its final norm, then lm_head, tied "
            "or not as its config says): the target itself differs, before any draft stage. Its output "
            "head: an untied lm_head read as the tied embedding or the reverse (`tie_word_embeddings`), "
            "or its final norm, where the features the draft reads (step 0's extracted features) still "
            "agree; else its layers, e.g. its RoPE read from one spelling of the config alone "
            "(`rope_theta` + `rope_scaling` as released checkpoints write them, or transformers 5's "
            "`rope_parameters`), which misses the other"
        ),
    ),
    Stage(
        name="first_token",
        title="first token x_0",
        meaning="argmax of the prefill's logits: the first committed token, block 0's anchor",
        layout="() int64",
        teacher_given=True,
        causes="x_0 is the argmax of the prefill's logits at the prompt's last position",
    ),
    Stage(
        name="layer_ids",
        title="layer ids",
        meaning=(
            "target layers feeding the draft (target_layer_ids); layer l is read at hidden_states[l + 1],"
            " index 0 being the embedding output"
        ),
        layout="(k,) int64",
        causes=(
            "target_layer_ids: the official formula is round(1 + i·(L − 4)/(n − 1)) (n = 1: [L // 2]), "
            "unless the draft's config gives them"
        ),
    ),
    Stage(
        name="target_hidden",
        title="extracted features",
        meaning=(
            "concat over features of the sampled target layers' hidden states at the new context "
            "positions (the prefill's, then the first τ + 1 of each verify)"
        ),
        layout="(L_c, k·d)",
        axes=(None, "context", "feature (k·d)"),
        block_free=True,
        context_axis=0,
        restorable=True,
        causes=(
            "layer l is read at hidden_states[l + 1] (index 0 is the embedding output); after a verify "
            "only the first τ + 1 positions' features are new context"
        ),
    ),
    Stage(
        name="fc",
        title="fc",
        meaning="W_fc · target_hidden, no bias",
        layout="(L_c, d)",
        axes=(None, "context", "hidden dim"),
        block_free=True,
        context_axis=0,
        restorable=True,
        causes=(
            "fc takes the concatenated features of the sampled layers, in target_layer_ids' order, "
            "without bias, and nothing before it: the RMSNorm (hidden_norm) comes after fc, on C; a norm "
            "applied to the features before fc shows here"
        ),
    ),
    Stage(
        name="context",
        title="C",
        meaning="C = RMSNorm_hidden(W_fc · target_hidden)",
        layout="(L_c, d)",
        axes=(None, "context", "hidden dim"),
        block_free=True,
        context_axis=0,
        restorable=True,
        causes="C = hidden_norm(fc(target_hidden)): fc first, then the RMSNorm",
    ),
    Stage(
        name="noise_embedding",
        title="block embedding",
        meaning="the target's embed_tokens of the block [x_0, mask, ..., mask]",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        window_free=True,
        draft_pass=True,
        block_axis=(0, 0),
        causes="the block is [x_0, mask, …, mask] embedded by the target's own embedding",
    ),
    Stage(
        name="attn_conv_taps",
        title="attention conv taps",
        meaning=(
            "DFlash 2: a_t = W_a x_t of the attention sublayer's convolution, x = RMSNorm_in(H); [:, 0] "
            "the prepare taps, [:, 1] the finish taps"
        ),
        layout="(L_q, 2, K, G)",
        axes=("block position · prepare/finish", "tap j", "group g"),
        block_axis=(0, 0),
        causes=(
            "DFlash 2: the taps are kernel_projection(x) of the sublayer's normed input, (2, K, G) per "
            "position: [0] for prepare, [1] for finish"
        ),
    ),
    Stage(
        name="attn_conv_in",
        title="attention conv input",
        meaning=(
            "DFlash 2: u_t = Σ_j (w⁰_j + a⁰_{t,j,g}) ⊙ x_{t−j}, zero before the block's first position: "
            "what Q, K and V of the block are computed from"
        ),
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        block_axis=(0, 0),
        causes=(
            "DFlash 2: u_t = Σ_j (w⁰_j + a⁰_{t,j,g}) ⊙ x_{t−j}, reading only x_t and earlier positions of"
            " this block (zero before its first): a convolution that reads later positions x_{t+j} shows "
            "here"
        ),
    ),
    Stage(
        name="q",
        title="Q after QNorm",
        meaning="QNorm(H W_Q) per head, before RoPE",
        layout="(H_q, L_q, d_h)",
        axes=("query head", "block", "head dim"),
        window_free=True,
        draft_pass=True,
        block_axis=(1, 0),
        causes="Q = q_norm(H W_Q) per head, before RoPE: a missing q_norm shows here",
    ),
    Stage(
        name="k_ctx",
        title="K context after KNorm",
        meaning="KNorm(C W_K) per head, before RoPE",
        layout="(H_kv, L_c, d_h)",
        axes=("KV head", "context", "head dim"),
        block_free=True,
        context_axis=1,
        restorable=True,
        window_keys_axis=1,
        causes=("K = k_norm([C W_K; H W_K]) per head, before RoPE: a missing k_norm, or context K from H, shows here"),
    ),
    Stage(
        name="k_noise",
        title="K block after KNorm",
        meaning="KNorm(H W_K) per head, before RoPE",
        layout="(H_kv, L_q, d_h)",
        axes=("KV head", "block", "head dim"),
        window_free=True,
        block_axis=(1, 0),
        causes="K = k_norm([C W_K; H W_K]) per head, before RoPE: a missing k_norm shows here",
    ),
    Stage(
        name="v",
        title="V",
        meaning="[C W_V; H W_V] per head (new positions only)",
        layout="(H_kv, L_c + L_q, d_h)",
        axes=("KV head", "key", "head dim"),
        window_free=True,
        context_axis=1,
        window_keys_axis=1,
        causes="V = [C W_V; H W_V], no norm",
    ),
    Stage(
        name="q_rot",
        title="Q after RoPE",
        meaning="Q rotated at the block's positions: the last L_q rows of the RoPE table",
        layout="(H_q, L_q, d_h)",
        axes=("query head", "block", "head dim"),
        window_free=True,
        block_axis=(1, 0),
        causes=(
            "Q is rotated at the block's positions, the last L_q rows of the RoPE tables; a wrong "
            "rope_theta or RoPE scaling shows here too"
        ),
    ),
    Stage(
        name="k_rot",
        title="K after RoPE",
        meaning="K rotated at all L_c + L_q new positions, the cached context K prepended",
        layout="(H_kv, L_k, d_h)",
        axes=("KV head", "key", "head dim"),
        draft_pass=True,
        window_keys_axis=1,
        causes="K is rotated at all L_c + L_q new positions and appended to the cached context K",
    ),
    Stage(
        name="pattern",
        title="attention weights",
        meaning=(
            "softmax(Q Kᵀ/√d_h) over every key (non-causal on full-attention layers; causal within the "
            "window on sliding ones), query head h reading KV head h // (H_q/H_kv)"
        ),
        layout="(H_q, L_q, L_k)",
        axes=("query head", "query", "key"),
        draft_pass=True,
        block_axis=(1, 0),
        window_keys_axis=2,
        causes=(
            "softmax(QKᵀ/√d_h) over context and block keys, non-causal inside the block on full-attention"
            " layers; query head h reads KV head h // (H_q / H_kv)"
        ),
    ),
    Stage(
        name="attn_out",
        title="attention output",
        meaning="W_O · attention output",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        block_axis=(0, 0),
        causes="o_proj of the attention output, heads concatenated in order",
    ),
    Stage(
        name="attn_conv_out",
        title="attention conv output",
        meaning="DFlash 2: W_O · attention output convolved with w¹ + a¹ (the taps of the sublayer's input)",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        block_axis=(0, 0),
        causes=(
            "DFlash 2: finish convolves the sublayer's output with w¹ and the taps a¹ computed from the "
            "sublayer's input, not from its output"
        ),
    ),
    Stage(
        name="mlp_conv_taps",
        title="MLP conv taps",
        meaning="DFlash 2: a_t = W_a x_t of the MLP sublayer's convolution, x = RMSNorm_post(H')",
        layout="(L_q, 2, K, G)",
        axes=("block position · prepare/finish", "tap j", "group g"),
        block_axis=(0, 0),
        causes="DFlash 2: the MLP's taps come from its own normed input, RMSNorm_post(H')",
    ),
    Stage(
        name="mlp_conv_in",
        title="MLP conv input",
        meaning="DFlash 2: the MLP's input, convolved with w⁰ + a⁰",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        block_axis=(0, 0),
        causes=(
            "DFlash 2: the MLP's input convolved as the attention's: causal (x_t and earlier, never "
            "later), restarted at the block start"
        ),
    ),
    Stage(
        name="mlp_conv_out",
        title="MLP conv output",
        meaning="DFlash 2: the MLP's output convolved with w¹ + a¹",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        block_axis=(0, 0),
        causes="DFlash 2: the MLP's output convolved with w¹ and the taps of the MLP's input",
    ),
    Stage(
        name="layer_out",
        title="layer output",
        meaning="H' = H + Attn(LN(H), C); H' + MLP(LN(H'))",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        block_axis=(0, 0),
        causes="pre-norm: H + Attn(LN(H)), then + MLP(LN(·))",
    ),
    Stage(
        name="final_hidden",
        title="final hidden",
        meaning="RMSNorm_final of the last layer's output, all L_q positions",
        layout="(L_q, d)",
        axes=(None, "block", "hidden dim"),
        draft_pass=True,
        block_axis=(0, 0),
        unread_rows_axis=0,
        causes="the final norm of the last layer's output",
    ),
    Stage(
        name="logits",
        title="draft logits",
        meaning="the target's lm_head on the draft's last L_q − 1 positions",
        layout="(γ, V)",
        axes=(None, "proposal", "vocab"),
        draft_pass=True,
        block_axis=(0, 1),
        causes="the target's lm_head on the draft's last L_q − 1 positions (`[:, 1:]`, position 0 is x_0)",
    ),
    Stage(
        name="candidates",
        title="candidates",
        meaning=(
            "DFlash 2: the top-K token ids of each proposal position's draft logits; a set: each row "
            "compared in increasing id order (unary and pair reordered alike)"
        ),
        layout="(γ, K) int64",
        block_axis=(0, 1),
        causes="DFlash 2: the selector_top_k largest draft logits at each proposal position (a set)",
    ),
    Stage(
        name="unary",
        title="unary scores",
        meaning="DFlash 2: z_{t,k}, the draft logits at the candidates",
        layout="(γ, K)",
        axes=(None, "proposal", "candidate k"),
        block_axis=(0, 1),
        causes="DFlash 2: the unary score of a candidate is its draft logit",
    ),
    Stage(
        name="pair",
        title="pair scores",
        meaning=(
            "DFlash 2: ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩, x_{t−1} the candidate chosen at t − 1 "
            "(x_0 the block's anchor)"
        ),
        layout="(γ, K)",
        axes=(None, "proposal", "candidate k"),
        block_axis=(0, 1),
        causes=(
            "DFlash 2: ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩: check first that both codebooks are "
            "loaded (released checkpoints store them without `.weight`: a loader that looks for `.weight`"
            " keeps its initial ones), and P h_t, the rank projection of the position's final hidden"
        ),
    ),
    Stage(
        name="draft_tokens",
        title="draft tokens",
        meaning=(
            "the proposals d_1..d_γ: the argmax of the draft logits (DFlash 1), the selector's path "
            "argmax_k (unary + pair) from the anchor (DFlash 2)"
        ),
        layout="(γ,) int64",
        block_axis=(0, 1),
        causes=(
            "greedy proposals are the argmax of the draft logits (DFlash 2: of unary + pair, walked from "
            "the anchor); where the port gave none of the draft's own tensors (its loop's values only), "
            "any draft stage's difference shows here first: dump the draft's stages to find which"
        ),
    ),
    Stage(
        name="verify_logits",
        title="target logits (verify)",
        meaning=(
            "the target's own logits at each verified block position [x_0, d_1, …, d_γ], from its cache "
            "cropped to `start`: the posterior is their argmax"
        ),
        layout="(L_q, V)",
        axes=(None, "block", "vocab"),
        teacher_given=True,
        block_axis=(0, 0),
        causes=(
            "the target's logits at the verified block [x_0, d_1, …] from its cache cropped to `start`: "
            "with the prefill's logits and this block's tokens right, the target's cache is what differs,"
            " most often not cropped back to `start` after the last verify (the rejected tokens' K/V "
            "still attended)"
        ),
    ),
    Stage(
        name="posterior",
        title="posterior",
        meaning="argmax of the target's logits at each verified block position",
        layout="(L_q,) int64",
        teacher_given=True,
        block_axis=(0, 0),
        causes="the target verifies [x_0, d_1, …] in one pass from its cache cropped to `start`",
    ),
    Stage(
        name="acceptance_length",
        title="acceptance length τ",
        meaning="Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}]",
        layout="() int64",
        teacher_given=True,
        causes="τ = Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}]: a cumulative product, not a count of matches",
    ),
    Stage(
        name="bonus",
        title="bonus token",
        meaning="posterior[τ], the target's token after the accepted run",
        layout="() int64",
        teacher_given=True,
        causes="the bonus is the target's token after the accepted run, posterior[τ], never a draft token",
    ),
    Stage(
        name="cache_lengths",
        title="cache lengths",
        meaning=(
            "[draft before the pass, draft after the pass, draft after its crop (= start), target before "
            "verify, target after verify, target after its crop (= new start)]"
        ),
        layout="(6,) int64",
        kind="observable",
        teacher_given=True,
        causes="the draft cache is cropped back to `start` after every pass; the target's to the new start",
    ),
    Stage(
        name="conv_state",
        title="target conv state",
        meaning=(
            "Hybrid targets: linear-attention layer l of the target after the step's crop to the n "
            "committed tokens: the last K − 1 inputs u_{n−K+2..n} of its causal conv, oldest first (zero "
            "before the first token)"
        ),
        layout="(C, K − 1)",
        axes=(None, "channel", "tap (oldest first)"),
        teacher_given=True,
        causes=(
            "after a verify of L tokens and the crop to n + m, a linear layer's conv window is the last K"
            " − 1 committed inputs, [W_n; u_{n+1..n+L}][m : m + K − 1], not the verify's last K − 1"
        ),
    ),
    Stage(
        name="recurrent_state",
        title="target recurrent state",
        meaning=(
            "Hybrid targets: S_n of linear-attention layer l after the step's crop, S_t = α_t S_{t−1} + "
            "β_t k_t (v_t − α_t S_{t−1}ᵀ k_t)ᵀ over the n committed tokens alone: the rejected ones "
            "undone"
        ),
        layout="(H_v, d_k, d_v)",
        axes=("value head", "d_k", "d_v"),
        teacher_given=True,
        causes=(
            "a crop cannot cut a recurrent state back (a crop-only rollback, as transformers' "
            "DynamicCache.crop, trims the conv window and leaves S with the rejected tokens in): keep S "
            "per verified position and pick S_{n+m} (target/hybrid_cache.py), or snapshot S_n before the "
            "verify and replay the m accepted tokens (the official MLX backend)"
        ),
    ),
    Stage(
        name="output_ids",
        title="output ids",
        meaning="prompt followed by every committed token",
        layout="(L,) int64",
        teacher_given=True,
        causes="every committed token is kept (also one equal to mask_token_id), none after a stop token",
    ),
)

STAGE = {s.name: s for s in STAGES}
STAGE_INDEX = {s.name: i for i, s in enumerate(STAGES)}
# views of the records, by stage name
KINDS = {s.name: s.kind for s in STAGES}
TITLES = {s.name: s.title for s in STAGES}
LAYER_STAGES = {
    "q": "self_attn.hook_q",
    "k_ctx": "self_attn.hook_k_ctx",
    "k_noise": "self_attn.hook_k_noise",
    "v": "self_attn.hook_v",
    "q_rot": "self_attn.hook_q_rot",
    "k_rot": "self_attn.hook_k_rot",
    "pattern": "self_attn.hook_pattern",
    "attn_out": "self_attn.hook_out",
    "layer_out": "hook_resid_post",
    "attn_conv_taps": "attention_conv.hook_taps",
    "attn_conv_in": "attention_conv.hook_prepared",
    "attn_conv_out": "attention_conv.hook_finished",
    "mlp_conv_taps": "mlp_conv.hook_taps",
    "mlp_conv_in": "mlp_conv.hook_prepared",
    "mlp_conv_out": "mlp_conv.hook_finished",
}
MODEL_STAGES = {
    "target_hidden": "draft.hook_target_hidden",
    "fc": "draft.context.hook_fc",
    "context": "draft.context.hook_context",
    "noise_embedding": "draft.hook_noise_embedding",
    "final_hidden": "draft.hook_out",
    "logits": "draft.hook_logits",
    "candidates": "draft.candidate_selector.hook_candidates",
    "unary": "draft.candidate_selector.hook_unary",
    "pair": "draft.candidate_selector.hook_pair",
}
TARGET_LAYER_STAGES = {"conv_state": "linear_attn.conv_state", "recurrent_state": "linear_attn.recurrent_state"}
LOOP_STAGES = ("draft_tokens", "posterior", "acceptance_length", "bonus", "cache_lengths")
# the target's own stages, keyed apart from the draft's hook points: the prefill's (before any draft stage) and
# the verify's logits of each step
PREFILL_STAGES = {
    "prefill_logits": "prefill/target_logits",
    "first_token": "prefill/first_token",
    "layer_ids": "prefill/layer_ids",
}
TARGET_STAGES = {"verify_logits": "target_logits"}
_PREFILL_KEYS = {v: k for k, v in PREFILL_STAGES.items()}
_BY_TARGET_NAME = {v: k for k, v in TARGET_STAGES.items()}
_BY_NAME = {v: k for k, v in MODEL_STAGES.items()}
_LAYER_NAME = re.compile(r"draft\.layers\.(\d+)\.(.+)")
_BY_SUFFIX = {v: k for k, v in LAYER_STAGES.items()}
_TARGET_LAYER_NAME = re.compile(r"target\.layers\.(\d+)\.(.+)")
_BY_TARGET_SUFFIX = {v: k for k, v in TARGET_LAYER_STAGES.items()}


# Not a stage: what a serving port says of how it served a bundle's request (Recorder.served). A prefix-cache hit
# restores the first `cached_prefix` prompt positions instead of computing them: at the first step their rows of
# the new context's stages (Stage.restorable, along its context_axis) are not the port's own and are not compared;
# the keys and values its draft attends there are (K after RoPE, V)
CACHED_PREFIX = "served/cached_prefix"
# and, where an engine hands over no draft tensors (a server), its own count of the request's draft tokens accepted
DRAFT_ACCEPTED = "served/draft_accepted"
SERVED = (CACHED_PREFIX, DRAFT_ACCEPTED)


def key_for(stage: str, step: int | None = None, layer: int | None = None) -> str:
    """The dump/manifest key of one tensor, e.g. key_for("q", 0, 1) = "step0/draft.layers.1.self_attn.hook_q"."""
    if stage in PREFILL_STAGES:
        return PREFILL_STAGES[stage]
    if stage == "output_ids":
        return "output_ids"
    name = (
        TARGET_STAGES[stage]
        if stage in TARGET_STAGES
        else f"draft.layers.{layer}.{LAYER_STAGES[stage]}"
        if stage in LAYER_STAGES
        else f"target.layers.{layer}.{TARGET_LAYER_STAGES[stage]}"
        if stage in TARGET_LAYER_STAGES
        else MODEL_STAGES.get(stage, stage)
    )
    return f"step{step}/{name}"


def parse_key(key: str) -> tuple[str, int | None, int | None]:
    """key → (stage, step, layer); ValueError for a key that names no stage."""
    if key in _PREFILL_KEYS:
        return _PREFILL_KEYS[key], None, None
    if key == "output_ids":
        return "output_ids", None, None
    match = re.fullmatch(r"step(\d+)/(.+)", key)
    if match:
        step, name = int(match.group(1)), match.group(2)
        if name in LOOP_STAGES:
            return name, step, None
        if name in _BY_TARGET_NAME:
            return _BY_TARGET_NAME[name], step, None
        if name in _BY_NAME:
            return _BY_NAME[name], step, None
        layer = _LAYER_NAME.fullmatch(name)
        if layer and layer.group(2) in _BY_SUFFIX:
            return _BY_SUFFIX[layer.group(2)], step, int(layer.group(1))
        layer = _TARGET_LAYER_NAME.fullmatch(name)
        if layer and layer.group(2) in _BY_TARGET_SUFFIX:
            return _BY_TARGET_SUFFIX[layer.group(2)], step, int(layer.group(1))
    raise ValueError(f"{key!r} names no stage of the conformance kit")


def stage_of(key: str) -> str | None:
    """The stage a key names, None for one that names none (a misspelt key)."""
    try:
        return parse_key(key)[0]
    except ValueError:
        return None


def of_draft_pass(key: str) -> bool:
    """Whether a key is one of a draft pass's own stages (Stage.draft_pass): a step with none ran no draft pass."""
    stage = stage_of(key)
    return stage is not None and STAGE[stage].draft_pass


def walk_order(key: str) -> tuple:
    """Sort key following the data's walk: prefill, then per step (context, layers, outputs, then a hybrid
    target's states after the crop, layer by layer), then output."""
    stage, step, layer = parse_key(key)
    index = STAGE_INDEX[stage]
    if stage in PREFILL_STAGES:
        return (0, index)
    if stage == "output_ids":
        return (2,)
    group = 1 if stage in LAYER_STAGES else (0 if index < STAGE_INDEX["q"] else 2)
    return (1, step, group, layer or 0, index)
