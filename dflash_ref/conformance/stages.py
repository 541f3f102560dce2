"""The stages of the conformance kit and their keys: what each tensor of a bundle is, in the order of the
data's walk (`STAGES`), its kind, and `key_for` / `parse_key` / `walk_order` between a stage and a key.

Keys: `prefill/{target_logits, first_token, layer_ids}` (the prefill's), `step{s}/{name}` (name: a hook point
of the reference, e.g. `draft.layers.0.self_attn.hook_q`, a loop value: `draft_tokens`, `posterior`, ..., the
target's verify logits `target_logits`, or a hybrid target's state after the step's crop:
`target.layers.{l}.linear_attn.recurrent_state`), `output_ids`.
"""

from __future__ import annotations

import re

# (stage id, title, meaning, layout), in the order of the data's walk. Per-layer stages are q..layer_out.
STAGES = [
    (
        "prefill_logits",
        "target logits (prefill)",
        "the target's own logits at the prompt's last position, after its final norm and lm_head (tied or not, as "
        "its config says): what x_0 is taken from",
        "(V,)",
    ),
    (
        "first_token",
        "first token x_0",
        "argmax of the prefill's logits: the first committed token, block 0's anchor",
        "() int64",
    ),
    (
        "layer_ids",
        "layer ids",
        "target layers feeding the draft (target_layer_ids); layer l is read at "
        "hidden_states[l + 1], index 0 being the embedding output",
        "(k,) int64",
    ),
    (
        "target_hidden",
        "extracted features",
        "concat over features of the sampled target layers' hidden "
        "states at the new context positions (the prefill's, then the first τ + 1 of each verify)",
        "(L_c, k·d)",
    ),
    ("fc", "fc", "W_fc · target_hidden, no bias", "(L_c, d)"),
    ("context", "C", "C = RMSNorm_hidden(W_fc · target_hidden)", "(L_c, d)"),
    ("noise_embedding", "block embedding", "the target's embed_tokens of the block [x_0, mask, ..., mask]", "(L_q, d)"),
    (
        "attn_conv_taps",
        "attention conv taps",
        "DFlash 2: a_t = W_a x_t of the attention sublayer's convolution, x = "
        "RMSNorm_in(H); [:, 0] the prepare taps, [:, 1] the finish taps",
        "(L_q, 2, K, G)",
    ),
    (
        "attn_conv_in",
        "attention conv input",
        "DFlash 2: u_t = Σ_j (w⁰_j + a⁰_{t,j,g}) ⊙ x_{t−j}, zero before the "
        "block's first position: what Q, K and V of the block are computed from",
        "(L_q, d)",
    ),
    ("q", "Q after QNorm", "QNorm(H W_Q) per head, before RoPE", "(H_q, L_q, d_h)"),
    ("k_ctx", "K context after KNorm", "KNorm(C W_K) per head, before RoPE", "(H_kv, L_c, d_h)"),
    ("k_noise", "K block after KNorm", "KNorm(H W_K) per head, before RoPE", "(H_kv, L_q, d_h)"),
    ("v", "V", "[C W_V; H W_V] per head (new positions only)", "(H_kv, L_c + L_q, d_h)"),
    (
        "q_rot",
        "Q after RoPE",
        "Q rotated at the block's positions: the last L_q rows of the RoPE table",
        "(H_q, L_q, d_h)",
    ),
    (
        "k_rot",
        "K after RoPE",
        "K rotated at all L_c + L_q new positions, the cached context K prepended",
        "(H_kv, L_k, d_h)",
    ),
    (
        "pattern",
        "attention weights",
        "softmax(Q Kᵀ/√d_h) over every key (non-causal on full-attention "
        "layers; causal within the window on sliding ones), query head h reading KV head h // (H_q/H_kv)",
        "(H_q, L_q, L_k)",
    ),
    ("attn_out", "attention output", "W_O · attention output", "(L_q, d)"),
    (
        "attn_conv_out",
        "attention conv output",
        "DFlash 2: W_O · attention output convolved with w¹ + a¹ (the taps of the sublayer's input)",
        "(L_q, d)",
    ),
    (
        "mlp_conv_taps",
        "MLP conv taps",
        "DFlash 2: a_t = W_a x_t of the MLP sublayer's convolution, x = RMSNorm_post(H')",
        "(L_q, 2, K, G)",
    ),
    ("mlp_conv_in", "MLP conv input", "DFlash 2: the MLP's input, convolved with w⁰ + a⁰", "(L_q, d)"),
    ("mlp_conv_out", "MLP conv output", "DFlash 2: the MLP's output convolved with w¹ + a¹", "(L_q, d)"),
    ("layer_out", "layer output", "H' = H + Attn(LN(H), C); H' + MLP(LN(H'))", "(L_q, d)"),
    ("final_hidden", "final hidden", "RMSNorm_final of the last layer's output, all L_q positions", "(L_q, d)"),
    ("logits", "draft logits", "the target's lm_head on the draft's last L_q − 1 positions", "(γ, V)"),
    (
        "candidates",
        "candidates",
        "DFlash 2: the top-K token ids of each proposal position's draft logits; a set: "
        "each row compared in increasing id order (unary and pair reordered alike)",
        "(γ, K) int64",
    ),
    ("unary", "unary scores", "DFlash 2: z_{t,k}, the draft logits at the candidates", "(γ, K)"),
    (
        "pair",
        "pair scores",
        "DFlash 2: ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩, x_{t−1} the candidate chosen "
        "at t − 1 (x_0 the block's anchor)",
        "(γ, K)",
    ),
    (
        "draft_tokens",
        "draft tokens",
        "the proposals d_1..d_γ: the argmax of the draft logits (DFlash 1), the "
        "selector's path argmax_k (unary + pair) from the anchor (DFlash 2)",
        "(γ,) int64",
    ),
    (
        "verify_logits",
        "target logits (verify)",
        "the target's own logits at each verified block position [x_0, d_1, …, d_γ], from its cache cropped "
        "to `start`: the posterior is their argmax",
        "(L_q, V)",
    ),
    ("posterior", "posterior", "argmax of the target's logits at each verified block position", "(L_q,) int64"),
    ("acceptance_length", "acceptance length τ", "Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}]", "() int64"),
    ("bonus", "bonus token", "posterior[τ], the target's token after the accepted run", "() int64"),
    (
        "cache_lengths",
        "cache lengths",
        "[draft before the pass, draft after the pass, draft after its crop "
        "(= start), target before verify, target after verify, target after its crop (= new start)]",
        "(6,) int64",
    ),
    (
        "conv_state",
        "target conv state",
        "Hybrid targets: linear-attention layer l of the target after the step's "
        "crop to the n committed tokens: the last K − 1 inputs u_{n−K+2..n} of its causal conv, oldest first (zero "
        "before the first token)",
        "(C, K − 1)",
    ),
    (
        "recurrent_state",
        "target recurrent state",
        "Hybrid targets: S_n of linear-attention layer l after the step's "
        "crop, S_t = α_t S_{t−1} + β_t k_t (v_t − α_t S_{t−1}ᵀ k_t)ᵀ over the n committed tokens alone: the rejected "
        "ones undone",
        "(H_v, d_k, d_v)",
    ),
    ("output_ids", "output ids", "prompt followed by every committed token", "(L,) int64"),
]
# semantic: what DFlash defines; observable: how an implementation lays out its state (variants.py)
KINDS = {s[0]: "observable" if s[0] == "cache_lengths" else "semantic" for s in STAGES}
STAGE_INDEX = {s[0]: i for i, s in enumerate(STAGES)}
TITLES = {s[0]: s[1] for s in STAGES}
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
# the new context's stages (RESTORED_ROWS: the row axis of each) are not the port's own and are not compared; the
# keys and values its draft attends there are (K after RoPE, V)
CACHED_PREFIX = "served/cached_prefix"
RESTORED_ROWS = {"target_hidden": 0, "fc": 0, "context": 0, "k_ctx": 1}
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
