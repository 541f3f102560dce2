"""Held-out buggy DFlash ports, for measuring the diagnosis (conformance/causes/) as one measures a model on
held-out data: written by another author who had not seen the catalogue (causes/catalogue.py), the kit's hints
(hints.py) or its reports, after the catalogue was written and before it was run on them.

Each class is the reference (ReferenceAdapter) with ONE small change, a mistake a port author makes writing DFlash
by hand, by varied mechanisms: a constant patched on a loaded module, a module's forward overridden, a function of
the loop or of attention re-implemented (patched into the module that calls it for the run alone), a cache wrapped.

    name        unique port name
    truth       the real cause, in a port author's words
    scenarios   the golden scenarios the bug shows on
    catalogued  the catalogue entry that is the same bug, None where the catalogue has none (so the right answer
                is "unexplained"): assigned from `truth` before the diagnosis was first run on these ports

`python -m dflash_ref.conformance.causes heldout tests/conformance/heldout_ports.py` measures the diagnosis on them
(causes/measure.py). OBSERVED (bottom) records where each first fails: (bundle, stage, step).
"""

from __future__ import annotations

import contextlib
import types

import torch
from einops import rearrange, repeat
from torch.nn import functional as F

import dflash_ref.attention as attention_mod
import dflash_ref.decoding as decoding_mod
import dflash_ref.draft_model as draft_model_mod
import dflash_ref.target.qwen3 as qwen3_mod
from dflash_ref.attention import KVInjectionAttention
from dflash_ref.candidate_selector import CandidateSelector
from dflash_ref.conformance.ports.reference import ReferenceAdapter
from dflash_ref.decoding import DraftedProposal, Proposal
from dflash_ref.dflash2 import DFlash2DecoderLayer
from dflash_ref.rope import rotate_half
from dflash_ref.target.hybrid_cache import LinearLayerState

# ---------------------------------------------------------------------------------------------------------------
# shared machinery
# ---------------------------------------------------------------------------------------------------------------


class _Heldout(ReferenceAdapter):
    """The reference with patches applied for the duration of one run: `patches()` → [(module, attr, value)]."""

    name = "heldout-base"
    truth = ""
    scenarios: tuple[str, ...] = ()
    crashes = False

    def patches(self) -> list[tuple[object, str, object]]:
        return []

    def run(self, bundle):
        with _scoped(self.patches()):
            return super().run(bundle)


@contextlib.contextmanager
def _scoped(patches):
    saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
    try:
        for obj, attr, value in patches:
            setattr(obj, attr, value)
        yield
    finally:
        for obj, attr, value in reversed(saved):
            setattr(obj, attr, value)


def _draft_attentions(draft):
    return [layer.self_attn for layer in draft.layers]


# ---------------------------------------------------------------------------------------------------------------
# 1. target features
# ---------------------------------------------------------------------------------------------------------------


def _extract_without_offset(hidden_states, layer_ids):
    # hidden_states[l] taken as "the output of layer l"
    return torch.cat([hidden_states[i] for i in layer_ids], dim=-1)  # (B, L, k·d)


class FeatureTap(_Heldout):
    name = "heldout-feature-tap"
    catalogued = "hidden-states-off-by-one"
    truth = (
        "I index the target's hidden_states tuple with the layer id directly, forgetting entry 0 is the embedding "
        "output"
    )
    scenarios = ("walkthrough", "block16")

    def patches(self):
        return [(decoding_mod, "extract_context_feature", _extract_without_offset)]


# ---------------------------------------------------------------------------------------------------------------
# 2. fc / hidden_norm / context
# ---------------------------------------------------------------------------------------------------------------


def _project_context_prenorm(target_hidden, fc, hidden_norm, hooks=None):
    d = hidden_norm.weight.shape[0]
    normed = torch.cat([hidden_norm(h) for h in target_hidden.split(d, dim=-1)], dim=-1)  # (B, L_c, k·d)
    projected = fc(normed)  # (B, L_c, d)
    if hooks is not None:
        projected = hooks.hook_fc(projected)
    return hooks.hook_context(projected) if hooks is not None else projected


class ContextNormOrder(_Heldout):
    name = "heldout-context-norm-order"
    catalogued = None
    truth = "I apply hidden_norm to each tapped target layer before the fc fusion instead of to fc's output"
    scenarios = ("walkthrough", "multiround")

    def patches(self):
        return [(draft_model_mod, "project_context", _project_context_prenorm)]


# ---------------------------------------------------------------------------------------------------------------
# 3. noise block / embeddings
# ---------------------------------------------------------------------------------------------------------------


class MaskEmbeddingZero(_Heldout):
    name = "heldout-mask-embedding-zero"
    catalogued = None
    truth = "the block's mask positions go in as zero vectors (pure 'noise') instead of the embedding of mask_token_id"
    scenarios = ("walkthrough", "stop_token")

    def load(self, bundle):
        target, draft = super().load(bundle)
        forward = draft.forward

        def forward_zero_masks(position_ids, attention_mask=None, *, noise_embedding, **kw):
            noise_embedding = noise_embedding.clone()
            noise_embedding[:, 1:] = 0  # positions 1..γ are masks: "no information"
            return forward(position_ids, attention_mask, noise_embedding=noise_embedding, **kw)

        draft.forward = forward_zero_masks
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 4. q/k norms
# ---------------------------------------------------------------------------------------------------------------


class _KCtxUnnormedAttention(KVInjectionAttention):
    def forward(self, hidden_states, context, position_embeddings, past_key_values=None, attention_mask=None):
        q_len = hidden_states.shape[1]
        heads = lambda x: rearrange(x, "b l (h d) -> b h l d", d=self.head_dim)  # noqa: E731
        q = self.hook_q(self.q_norm(heads(self.q_proj(hidden_states))))
        k_ctx = self.hook_k_ctx(heads(self.k_proj(context)))  # context already normed by hidden_norm
        k_noise = self.hook_k_noise(self.k_norm(heads(self.k_proj(hidden_states))))
        k = torch.cat([k_ctx, k_noise], dim=2)
        v = torch.cat([heads(self.v_proj(context)), heads(self.v_proj(hidden_states))], dim=2)
        v = self.hook_v(v)
        cos, sin = position_embeddings
        q, k = attention_mod.apply_sliced_rope(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        q, k = self.hook_q_rot(q), self.hook_k_rot(k)
        visible = (
            attention_mask
            if attention_mask is not None
            else attention_mod.visibility_mask(
                q_len, k.shape[2], is_causal=self.is_causal, sliding_window=self.sliding_window,
                device=q.device, rotating=self.rotating,
            )
        )  # fmt: skip
        explicit = not self.use_sdpa or self.hook_scores.active or self.hook_pattern.active
        out, weights = attention_mod.attend(
            q, k, v, visible, self.scaling, explicit=explicit,
            scores_hook=self.hook_scores, pattern_hook=self.hook_pattern,
        )  # fmt: skip
        out = rearrange(out, "b h l d -> b l (h d)")
        return self.hook_out(self.o_proj(out)), weights


class KNormContextSkipped(_Heldout):
    name = "heldout-knorm-context"
    catalogued = "k-norm-on-block-only"
    truth = (
        "k_norm is applied to the block's keys only; the injected context keys skip it (the context was already normed)"
    )
    scenarios = ("walkthrough", "multiround")

    def load(self, bundle):
        target, draft = super().load(bundle)
        for attn in _draft_attentions(draft):
            attn.__class__ = _KCtxUnnormedAttention
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 5. RoPE: tables sliced for Q
# ---------------------------------------------------------------------------------------------------------------


def _rope_q_head_rows(q, k, cos, sin):
    q_len = q.shape[-2]
    cos, sin = cos[:, None], sin[:, None]
    q_embed = q * cos[..., :q_len, :] + rotate_half(q) * sin[..., :q_len, :]  # Q gets the first L_q rows
    k_embed = k * cos + rotate_half(k) * sin
    return q_embed, k_embed


class RopeQueryRows(_Heldout):
    name = "heldout-rope-query-rows"
    catalogued = "rope-query-rows-from-front"
    truth = (
        "the draft's Q is rotated with the first L_q rows of the cos/sin table (the context's positions) instead of "
        "the last L_q"
    )
    scenarios = ("walkthrough", "multiround")

    def patches(self):
        return [(attention_mod, "apply_sliced_rope", _rope_q_head_rows)]


# ---------------------------------------------------------------------------------------------------------------
# 6. RoPE: positions / offsets
# ---------------------------------------------------------------------------------------------------------------


class RopePositionsRestart(_Heldout):
    name = "heldout-rope-positions-restart"
    catalogued = None
    truth = "the draft's position ids are arange(L_c + L_q) on every pass, not offset by where the new context starts"
    scenarios = ("multiround", "walkthrough")

    def load(self, bundle):
        target, draft = super().load(bundle)
        forward = draft.forward

        def forward_local_positions(position_ids, *args, **kw):
            local = torch.arange(position_ids.shape[1], device=position_ids.device)[None]  # (1, L_c + L_q)
            return forward(local, *args, **kw)

        draft.forward = forward_local_positions
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 7. RoPE: scaling
# ---------------------------------------------------------------------------------------------------------------


class YarnAttentionFactor(_Heldout):
    name = "heldout-yarn-attention-factor"
    catalogued = None
    truth = (
        "my draft's YaRN RoPE uses the scaled frequencies but never multiplies cos/sin by the attention factor (mscale)"
    )
    scenarios = ("rope_yarn",)

    def load(self, bundle):
        target, draft = super().load(bundle)
        draft.rotary_emb.attention_scaling = 1.0
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 8. the target's forward: RoPE layout
# ---------------------------------------------------------------------------------------------------------------


def _rope_interleaved(q, k, cos, sin):
    half = cos.shape[-1] // 2
    cos = cos[..., :half].repeat_interleave(2, dim=-1)[:, None]  # (B, 1, L, d_h): θ per adjacent pair
    sin = sin[..., :half].repeat_interleave(2, dim=-1)[:, None]

    def rotate_pairs(x):
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)  # (x0, x1) → (−x1, x0)

    q_len = q.shape[-2]
    return q * cos[..., -q_len:, :] + rotate_pairs(q) * sin[..., -q_len:, :], k * cos + rotate_pairs(k) * sin


class TargetRopeInterleaved(_Heldout):
    name = "heldout-target-rope-interleaved"
    catalogued = None
    truth = "my Qwen3 target rotates adjacent channel pairs (GPT-J / 'normal' RoPE) instead of the two halves (NeoX)"
    scenarios = ("walkthrough", "multiround")

    def patches(self):
        return [(qwen3_mod, "apply_sliced_rope", _rope_interleaved)]


# ---------------------------------------------------------------------------------------------------------------
# 9. masks and windows
# ---------------------------------------------------------------------------------------------------------------


def _position_rule_inclusive(q_pos, k_pos, *, is_causal, sliding_window, block_start=None):
    if not is_causal and sliding_window is None:
        return None
    q_pos, k_pos = q_pos[:, None], k_pos[None, :]
    visible = torch.ones(q_pos.shape[0], k_pos.shape[1], dtype=torch.bool, device=q_pos.device)
    if is_causal:
        visible &= k_pos <= q_pos
    if sliding_window is not None:
        in_window = (q_pos - k_pos) <= sliding_window
        if not is_causal:
            in_window &= (k_pos - q_pos) <= sliding_window
        if block_start is not None:
            in_window |= k_pos >= block_start[:, None]
        visible &= in_window
    return visible


class WindowInclusive(_Heldout):
    name = "heldout-window-inclusive"
    catalogued = "window-one-wider"
    truth = "my sliding-window mask keeps keys with q − k <= window; the window means q − k < window"
    scenarios = ("gqa_sliding", "window_symmetric")

    def patches(self):
        return [(attention_mod, "position_rule", _position_rule_inclusive)]


# ---------------------------------------------------------------------------------------------------------------
# 10. GQA head mapping
# ---------------------------------------------------------------------------------------------------------------


def _attend_tiled_kv(q, k, v, visible, scaling, *, explicit, scores_hook=None, pattern_hook=None):
    groups = q.shape[1] // k.shape[1]
    k = repeat(k, "b hkv l d -> b (g hkv) l d", g=groups)  # KV heads tiled: query head h reads h mod H_kv
    v = repeat(v, "b hkv l d -> b (g hkv) l d", g=groups)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scaling
    if visible is not None:
        scores = scores.masked_fill(~visible, float("-inf"))
    if scores_hook is not None:
        scores = scores_hook(scores)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if pattern_hook is not None:
        weights = pattern_hook(weights)
    return torch.matmul(weights, v), (weights if explicit else None)


class GqaTiledHeads(_Heldout):
    name = "heldout-gqa-tiled-heads"
    catalogued = "gqa-heads-interleaved"
    truth = (
        "the draft's GQA expands K/V with repeat (tile) instead of repeat_interleave, so query head h reads KV head h "
        "mod H_kv"
    )
    scenarios = ("gqa_sliding", "multiround")

    def patches(self):
        return [(attention_mod, "attend", _attend_tiled_kv)]


# ---------------------------------------------------------------------------------------------------------------
# 11. attention scale
# ---------------------------------------------------------------------------------------------------------------


class ScaleFromHidden(_Heldout):
    name = "heldout-scale-from-hidden"
    catalogued = None
    truth = (
        "the draft's softmax scale is 1/sqrt(hidden_size / num_attention_heads), not 1/sqrt(head_dim) from the config"
    )
    scenarios = ("gqa_sliding",)

    def load(self, bundle):
        target, draft = super().load(bundle)
        for attn in _draft_attentions(draft):
            attn.scaling = (draft.config.hidden_size // draft.config.num_attention_heads) ** -0.5
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 12. MLP
# ---------------------------------------------------------------------------------------------------------------


def _swiglu_act_on_up(self, x):
    return self.down_proj(self.gate_proj(x) * F.silu(self.up_proj(x)))


class MlpActivationOnUp(_Heldout):
    name = "heldout-mlp-act-on-up"
    catalogued = "mlp-gate-up-swapped"
    truth = "the draft's SwiGLU applies SiLU to up_proj's output and multiplies by gate_proj's (gate and up swapped)"
    scenarios = ("walkthrough", "multiround")

    def load(self, bundle):
        target, draft = super().load(bundle)
        for layer in draft.layers:
            layer.mlp.forward = types.MethodType(_swiglu_act_on_up, layer.mlp)
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 13. final hidden → logits slicing
# ---------------------------------------------------------------------------------------------------------------


def _draft_block_slice_head(draft, target, draft_cache, temperature, top_p, top_k, verifier, block):
    block_ids = block.ids()
    if block.size == 1:
        return Proposal(block_ids)
    start, ctx_len = block.start, block.target_hidden.shape[1]
    noise = target.embed(block_ids) * draft.config.input_embedding_scale
    positions = torch.arange(start - ctx_len, start + block.size, device=block_ids.device)[None]
    cached = draft_cache.get_seq_length()
    hidden = draft(positions, noise_embedding=noise, target_hidden=block.target_hidden, past_key_values=draft_cache)
    hidden = hidden[:, :-1]  # the γ predictions (the last position has nothing after it)
    cache_lengths = (cached, draft_cache.get_seq_length())
    draft_cache.crop(start)
    draft_logits = draft.compute_logits(hidden, block.head)
    sampled = temperature > 0 and verifier == "rejection"
    block_ids[:, 1:], draft_probs, candidates = draft.choose_tokens(
        hidden, draft_logits, block_ids[:, 0], temperature if sampled else 0.0, top_p, top_k
    )
    return DraftedProposal(
        block_ids, draft_probs, candidates,
        drafted=block_ids.clone(), context_length=ctx_len, cache_lengths=cache_lengths,
        hidden=hidden, logits=draft_logits, draft=draft,
    )  # fmt: skip


class LogitsSliceHead(_Heldout):
    name = "heldout-logits-slice-head"
    catalogued = "logits-from-first-positions"
    truth = "I keep draft_hidden[:, :-1] (next-token shift, as in an LM) where DFlash keeps [:, 1:] (position 0 is x_0)"
    scenarios = ("walkthrough", "multiround")

    def patches(self):
        return [(decoding_mod, "draft_block", _draft_block_slice_head)]


# ---------------------------------------------------------------------------------------------------------------
# 14. DFlash 2 convolution
# ---------------------------------------------------------------------------------------------------------------


class _TapsFromOutputLayer(DFlash2DecoderLayer):
    """finish() convolves the sublayer's output with taps projected from that output, not from its input."""

    @staticmethod
    def _around(conv, sublayer, x, blocks):
        prepared, _ = conv.prepare(x, blocks)
        out = sublayer(prepared)
        taps = rearrange(conv.kernel_projection(out), "b l (h k g) -> b l h k g", h=2, k=conv.kernel_size)
        return conv.finish(out, taps[:, :, 1], blocks)

    def attend(self, x, *attention_inputs, blocks: int = 1):
        return self._around(
            self.attention_conv,
            lambda u: self.self_attn(u, *attention_inputs)[0],
            x,
            blocks,
        )

    def feed_forward(self, x, *, blocks: int = 1):
        return self._around(self.mlp_conv, self.mlp, x, blocks)


class Dflash2FinishTaps(_Heldout):
    name = "heldout-dflash2-finish-taps"
    catalogued = "finish-taps-from-output"
    truth = (
        "in DFlash 2's conv, the second (finish) dynamic taps are projected from the sublayer's output instead of its "
        "input"
    )
    scenarios = ("dflash2",)

    def load(self, bundle):
        target, draft = super().load(bundle)
        for layer in draft.layers:
            if isinstance(layer, DFlash2DecoderLayer):  # DFlash 1 drafts run as the reference
                layer.__class__ = _TapsFromOutputLayer
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 15. DFlash 2 candidate selector
# ---------------------------------------------------------------------------------------------------------------


class _ParallelSelector(CandidateSelector):
    """Vectorised over positions: each position's predecessor is the previous position's top logit (the anchor at
    t = 0), not the candidate the path chose there."""

    def select(self, hidden, logits, anchor_ids, temperature, sample=None):
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)
        candidates, unary = self.hook_candidates(candidates), self.hook_unary(unary)
        projected = self.hidden_projection(hidden)  # (B, γ, r)
        previous = torch.cat([anchor_ids[:, None], logits[:, :-1].argmax(-1)], dim=1)  # (B, γ)
        pair = self.pair_term(previous, projected, candidates)  # (B, γ, M)
        scores = unary + pair
        self.hook_pair(pair)
        if temperature > 0:
            q = torch.softmax(scores.float() / temperature, dim=-1)
            index = torch.stack([sample(q[:, t]) for t in range(q.shape[1])], dim=1)
        else:
            q, index = None, scores.argmax(-1)
        path = self.hook_path(candidates.gather(-1, index[..., None])[..., 0])
        return path, candidates, self.hook_q(q) if q is not None else None


class SelectorParallelPredecessor(_Heldout):
    name = "heldout-selector-parallel"
    catalogued = None
    truth = (
        "my DFlash 2 selector scores all positions at once, using the previous position's argmax logit as predecessor "
        "instead of the token the path chose"
    )
    scenarios = ("dflash2",)

    def load(self, bundle):
        target, draft = super().load(bundle)
        if hasattr(draft, "candidate_selector"):  # DFlash 1 drafts run as the reference
            draft.candidate_selector.__class__ = _ParallelSelector
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 16. acceptance / τ / bonus
# ---------------------------------------------------------------------------------------------------------------


def _verify_count_matches(draft_tokens, target_logits, draft_probs, temperature, top_p=1.0, top_k=0,
                          verifier="rejection", candidates=None):  # fmt: skip
    posterior = target_logits.argmax(dim=-1)  # (1, γ + 1)
    tau = 0
    for i in range(draft_tokens.shape[1]):
        if int(draft_tokens[0, i]) == int(posterior[0, i]):
            tau += 1  # counts every matching position
    return tau, posterior[0, tau], posterior


class AcceptCountsMatches(_Heldout):
    name = "heldout-accept-counts-matches"
    catalogued = "tau-counts-matches"
    truth = "my greedy verify counts every draft token equal to the target's, without stopping at the first mismatch"
    scenarios = ("multiround",)

    def patches(self):
        return [(decoding_mod, "verify_block", _verify_count_matches)]


# ---------------------------------------------------------------------------------------------------------------
# 17. draft cache cropping
# ---------------------------------------------------------------------------------------------------------------


class DraftCacheKeepsAnchor(_Heldout):
    name = "heldout-draft-cache-keeps-anchor"
    catalogued = None
    truth = (
        "after a draft pass I crop the draft cache to start + 1, keeping x_0's block K/V because x_0 is already "
        "committed"
    )
    scenarios = ("multiround", "walkthrough")

    def load(self, bundle):
        target, draft = super().load(bundle)
        make = draft.make_cache

        def make_cache():
            cache = make()
            crop = cache.crop
            cache.crop = lambda length: crop(min(length + 1, cache.get_seq_length()))
            return cache

        draft.make_cache = make_cache
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 18. target cache cropping
# ---------------------------------------------------------------------------------------------------------------


class TargetCacheCountsBonus(_Heldout):
    name = "heldout-target-crop-counts-bonus"
    catalogued = "target-cache-cropped-one-long"
    truth = (
        "after verify I crop the target cache to start + τ + 2 as if the bonus token's K/V were already cached (keeps "
        "a rejected token's K/V)"
    )
    scenarios = ("multiround", "gqa_sliding")

    def load(self, bundle):
        target, draft = super().load(bundle)
        make = target.make_cache

        def make_cache():
            cache = make()
            crop = cache.crop
            cache.crop = lambda length: crop(min(length + 1, cache.get_seq_length()))
            return cache

        target.make_cache = make_cache
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 19. hybrid target: linear-state rollback
# ---------------------------------------------------------------------------------------------------------------


class _RollbackWindowState(LinearLayerState):
    def pick(self, m, keep_positions):
        if not 0 < m < self.pending:  # commit of the whole forward (or nothing): as DFlash
            return super().pick(m, keep_positions)
        window = self.inputs.shape[-1] - self.pending  # K − 1
        self.conv = self.inputs[..., m - 1 : m - 1 + window].clone()  # "the window ending at the last kept token"
        self.recurrent = self.states[:, :, m - 1].clone()
        self.length += m
        self.inputs = self.states = None
        self.pending = 0


class HybridConvWindowRollback(_Heldout):
    name = "heldout-hybrid-conv-rollback"
    catalogued = None
    truth = (
        "rolling back a Gated DeltaNet layer after a rejection, I slice the conv window one position too early (it "
        "ends before the last kept input)"
    )
    scenarios = ("hybrid_target",)

    def load(self, bundle):
        target, draft = super().load(bundle)
        make = target.make_cache

        def make_cache():
            cache = make()
            for state in getattr(cache, "linear", {}).values():  # a plain KVCache (Qwen3 target): nothing to do
                state.__class__ = _RollbackWindowState
            return cache

        target.make_cache = make_cache
        return target, draft


# ---------------------------------------------------------------------------------------------------------------
# 20. stop tokens
# ---------------------------------------------------------------------------------------------------------------


def _committed_accepted_only(output_ids, start, tau, max_length, stop_tokens):
    produced = min(tau + 1, max_length - start - 1)
    hits = torch.isin(output_ids[0, start + 1 : start + tau + 1], stop_tokens).nonzero()  # the accepted drafts
    if hits.numel():
        return int(hits[0, 0]) + 1, True
    return produced, False


class StopBonusUnchecked(_Heldout):
    name = "heldout-stop-bonus-unchecked"
    catalogued = None
    truth = (
        "I look for stop tokens among the accepted draft tokens only; a stop token that is the bonus does not end "
        "generation"
    )
    scenarios = ("stop_bonus",)

    def patches(self):
        return [(decoding_mod, "_committed", _committed_accepted_only)]


# ---------------------------------------------------------------------------------------------------------------

PORTS = [
    FeatureTap,
    ContextNormOrder,
    MaskEmbeddingZero,
    KNormContextSkipped,
    RopeQueryRows,
    RopePositionsRestart,
    YarnAttentionFactor,
    TargetRopeInterleaved,
    WindowInclusive,
    GqaTiledHeads,
    ScaleFromHidden,
    MlpActivationOnUp,
    LogitsSliceHead,
    Dflash2FinishTaps,
    SelectorParallelPredecessor,
    AcceptCountsMatches,
    DraftCacheKeepsAnchor,
    TargetCacheCountsBonus,
    HybridConvWindowRollback,
    StopBonusUnchecked,
]


# name → (bundle, stage, step) of the first failing check, on the first of its scenarios that fails
OBSERVED = {
    "heldout-accept-counts-matches": ("multiround", "acceptance_length", 1),
    "heldout-context-norm-order": ("walkthrough", "fc", 0),
    "heldout-dflash2-finish-taps": ("dflash2", "attn_conv_out", 0),
    "heldout-draft-cache-keeps-anchor": ("multiround", "k_rot", 1),
    "heldout-feature-tap": ("walkthrough", "target_hidden", 0),
    "heldout-gqa-tiled-heads": ("gqa_sliding", "pattern", 0),
    "heldout-hybrid-conv-rollback": ("hybrid_target", "conv_state", 0),
    "heldout-knorm-context": ("walkthrough", "k_ctx", 0),
    "heldout-logits-slice-head": ("walkthrough", "logits", 0),
    "heldout-mask-embedding-zero": ("walkthrough", "noise_embedding", 0),
    "heldout-mlp-act-on-up": ("walkthrough", "layer_out", 0),
    "heldout-rope-positions-restart": ("multiround", "q_rot", 1),
    "heldout-rope-query-rows": ("walkthrough", "q_rot", 0),
    "heldout-scale-from-hidden": ("gqa_sliding", "pattern", 0),
    "heldout-selector-parallel": ("dflash2", "pair", 1),
    "heldout-stop-bonus-unchecked": ("stop_bonus", "extra_step", 9),
    "heldout-target-crop-counts-bonus": ("multiround", "verify_logits", 2),
    "heldout-target-rope-interleaved": ("walkthrough", "prefill_logits", None),
    "heldout-window-inclusive": ("gqa_sliding", "pattern", 0),
    "heldout-yarn-attention-factor": ("rope_yarn", "q_rot", 0),
}
