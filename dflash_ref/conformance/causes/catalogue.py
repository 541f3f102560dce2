"""The catalogue of mis-implementations: each entry one small, named change of one stage of the reference, the way a
port gets that stage wrong. Run as a port (`Mutant`), an entry gives the tensors that bug gives; the diagnosis
(diagnose.py) holds a failing port's tensors against them and names the entries that reproduce them to rounding.

An entry is a `Cause`: its name, the stage where it first shows (where it parts from DFlash), one line of what
the port does, whether it applies to a bundle's models (a RoPE-scaling bug needs a scaled RoPE), and `change`,
which edits the freshly loaded reference (draft and target) or patches one function of this package for the
run (a `Change` restores every patch when the run ends). A new bug class is one entry here; `python -m
dflash_ref.conformance.causes` lists them.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from unittest import mock

import torch
from einops import rearrange
from torch import nn
from torch.nn import functional as F

from ... import attention, decoding, dynamic_conv
from ...layer_sampling import HIDDEN_STATE_OFFSET, build_target_layer_ids
from ...rope import RotaryEmbedding
from ...target.hybrid_cache import HybridCache, LinearLayerState
from ..ports import reference


@dataclass
class Change:
    """What an entry changes, for one run: the loaded models, and `patch` for a function or method of this package,
    undone when the run ends."""

    draft: nn.Module
    target: nn.Module
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def patch(self, owner, name: str, value) -> None:
        self.stack.enter_context(mock.patch.object(owner, name, value))

    @property
    def attentions(self) -> list[nn.Module]:
        """The draft's attention modules, layer by layer."""
        return [layer.self_attn for layer in self.draft.layers]


@dataclass(frozen=True)
class Cause:
    name: str
    stage: str  # where it first shows: the first stage at which its run parts from DFlash
    says: str  # what the port does, in one line
    change: Callable[[Change], None]
    applies: Callable[[nn.Module, nn.Module], bool] = lambda draft, target: True  # (draft, target) loaded
    shows_on: str = "walkthrough"  # a golden scenario where it shows (the catalogue's own test runs it there)
    also: tuple[str, ...] = ()  # other stages where it may first show instead (a model where `stage` hides it)

    @property
    def stages(self) -> tuple[str, ...]:
        return (self.stage, *self.also)


# ------------------------------------------------------------------------------------------ helpers


def _wrap(owner, name: str, make) -> Callable[[Change], None]:
    """A change that replaces owner.name (a function of this package) by make(the original)."""

    def change(c: Change) -> None:
        c.patch(owner, name, make(getattr(owner, name)))

    return change


def _set_on_attentions(**values) -> Callable[[Change], None]:
    def change(c: Change) -> None:
        for attn in c.attentions:
            for key, value in values.items():
                setattr(attn, key, value(attn) if isinstance(value, types.FunctionType) else value)

    return change


def _version(n: int) -> Callable:
    return lambda draft, target: draft.config.version == n


def _hybrid(draft, target) -> bool:
    return isinstance(target.make_cache(), HybridCache)


def _sliding(draft, target) -> bool:
    return any(getattr(a.self_attn, "sliding_window", None) is not None for a in draft.layers)


def _kind_of(attn) -> str:
    return "rotating" if attn.rotating else "causal" if attn.is_causal else "symmetric"


def _window_as(kind: str) -> Callable[[Change], None]:
    def change(c: Change) -> None:
        for attn in c.attentions:
            if attn.sliding_window is not None:
                attn.is_causal, attn.rotating = kind != "symmetric", kind == "rotating"

    return change


def _window_other_than(kind: str) -> Callable:
    return lambda draft, target: any(
        a.self_attn.sliding_window is not None and _kind_of(a.self_attn) != kind for a in draft.layers
    )


def _rope(rotary: RotaryEmbedding, theta: float | None = None, scaling: dict | None | bool = False) -> RotaryEmbedding:
    """A copy of `rotary` with another θ or scaling (False: its own)."""
    return RotaryEmbedding(
        rotary.head_dim, rotary.rope_theta if theta is None else theta, rotary.scaling if scaling is False else scaling
    )


def _draft_forward(c: Change, make) -> None:
    """Replace the draft's forward by make(the original) for the run."""
    c.patch(c.draft, "forward", make(c.draft.forward))


class _Alternate(nn.Module):
    """A norm applied on every other call only (KVInjectionAttention calls k_norm on the context, then the block)."""

    def __init__(self, norm: nn.Module, on_first: bool) -> None:
        super().__init__()
        self.norm, self.on_first, self.calls = norm, on_first, 0

    def forward(self, x):
        first = self.calls % 2 == 0
        self.calls += 1
        return self.norm(x) if first == self.on_first else x


class _HeadsTransposed(nn.Module):
    """o_proj fed the heads' outputs as (d_h, H) instead of (H, d_h)."""

    def __init__(self, proj: nn.Linear, heads: int) -> None:
        super().__init__()
        self.proj, self.heads = proj, heads

    def forward(self, x):
        return self.proj(rearrange(x, "b l (h d) -> b l (d h)", h=self.heads))  # (B, L_q, d_h · H)


# ------------------------------------------------------------------------------------------ the changes


def _no_q_k_norm_target(c: Change) -> None:
    for layer in c.target.model.layers:
        layer.self_attn.q_norm = layer.self_attn.k_norm = None


def _rope_interleaved(original):
    def rotate_pairs(x):  # [x0, x1, x2, x3, …] → [−x1, x0, −x3, x2, …]
        pairs = rearrange(x, "... (d two) -> ... d two", two=2)  # (…, d_h/2, 2)
        return rearrange(torch.stack((-pairs[..., 1], pairs[..., 0]), -1), "... d two -> ... (d two)")

    def apply(q, k, cos, sin):
        half = cos.shape[-1] // 2  # the tables repeat [θ, θ]: interleave them as [θ_0, θ_0, θ_1, θ_1, …]
        cos, sin = (torch.repeat_interleave(t[..., :half], 2, dim=-1)[:, None] for t in (cos, sin))
        q_len = q.shape[-2]
        return (
            q * cos[..., -q_len:, :] + rotate_pairs(q) * sin[..., -q_len:, :],
            k * cos + rotate_pairs(k) * sin,
        )

    return apply


def _rope_query_from_front(original):
    def apply(q, k, cos, sin):
        q_len = q.shape[-2]
        return original(q, k[..., :q_len, :], cos[..., :q_len, :], sin[..., :q_len, :])[0], original(q, k, cos, sin)[1]

    return apply


def _block_positions_from_zero(forward):
    def run(position_ids, *args, noise_embedding, **kwargs):
        q_len = noise_embedding.shape[1]
        moved = position_ids.clone()
        moved[:, -q_len:] = torch.arange(q_len, device=moved.device)  # the block at 0 … L_q − 1
        return forward(moved, *args, noise_embedding=noise_embedding, **kwargs)

    return run


def _positions_plus_one(forward):
    return lambda position_ids, *args, **kwargs: forward(position_ids + 1, *args, **kwargs)


def _logits_from_first_positions(forward):
    def run(*args, **kwargs):
        hidden = forward(*args, **kwargs)  # (B, L_q, d); draft_block keeps [:, 1:]: make that the first L_q − 1
        return torch.cat([hidden[:, :1], hidden[:, :-1]], dim=1)

    return run


def _gqa_interleaved(original):
    def attend(q, k, v, visible, scaling, **kwargs):
        groups = q.shape[1] // k.shape[1]  # query head h reads KV head h % H_kv, not h // groups
        return original(q, k.repeat(1, groups, 1, 1), v.repeat(1, groups, 1, 1), visible, scaling, **kwargs)

    return attend


def _heads_transposed(c: Change) -> None:
    for attn in c.attentions:
        attn.o_proj = _HeadsTransposed(attn.o_proj, attn.num_heads)


def _gelu_mlp(c: Change) -> None:
    for layer in c.draft.layers:
        mlp = layer.mlp
        c.patch(mlp, "forward", lambda x, m=mlp: m.down_proj(F.gelu(m.gate_proj(x)) * m.up_proj(x)))


def _gate_up_swapped(c: Change) -> None:
    for layer in c.draft.layers:
        mlp = layer.mlp
        mlp.gate_proj, mlp.up_proj = mlp.up_proj, mlp.gate_proj


def _no_attention_residual(c: Change) -> None:
    for layer in c.draft.layers:

        def forward(h, context, position_embeddings, past_key_values=None, attention_mask=None, *, blocks=1, m=layer):
            attended = m.attend(m.input_layernorm(h), context, position_embeddings, past_key_values, attention_mask,
                                blocks=blocks)  # fmt: skip
            h = m.hook_resid_mid(attended)  # H' = Attn(·), the residual H dropped
            return m.hook_resid_post(h + m.feed_forward(m.post_attention_layernorm(h), blocks=blocks))

        c.patch(layer, "forward", forward)


def _features(layer_ids_of) -> Callable:
    """extract_context_feature with the layers read as layer_ids_of(hidden_states, layer_ids) says."""

    def make(original):
        return lambda hidden_states, layer_ids: torch.cat(layer_ids_of(hidden_states, list(layer_ids)), dim=-1)

    return make


def _from_the_end(original):
    return lambda hidden_states, layer_ids, produced: decoding.extract_context_feature(hidden_states, layer_ids)[
        :, -produced:
    ]  # (1, produced, k·d): the verify's last positions, not its first


def _verify_block(decide) -> Callable:
    """verify_block whose τ and bonus come from decide(drafts (γ,), posterior (γ + 1,)) → (τ, bonus) (greedy)."""

    def make(original):
        def verify(drafts, logits, *args, **kwargs):
            tau, bonus, posterior = original(drafts, logits, *args, **kwargs)
            if posterior is None:  # sampled: left as it is
                return tau, bonus, posterior
            tau, bonus = decide(drafts[0].tolist(), posterior[0].tolist())
            return tau, torch.tensor([bonus], device=drafts.device), posterior

        return verify

    return make


def _count_matches(drafts, posterior):
    tau = sum(d == p for d, p in zip(drafts, posterior))
    return tau, posterior[tau]


def _same_position(drafts, posterior):
    tau = 0
    while tau < len(drafts) and drafts[tau] == posterior[tau + 1]:
        tau += 1
    return tau, posterior[tau]


def _bonus_from_draft(drafts, posterior):
    tau = 0
    while tau < len(drafts) and drafts[tau] == posterior[tau]:
        tau += 1
    return tau, drafts[tau] if tau < len(drafts) else posterior[tau]


def _cache_crop(target_side: bool, crop) -> Callable[[Change], None]:
    """Every cache the run makes (the target's or the draft's) crops as crop(cache, length, the real crop) does."""

    def change(c: Change) -> None:
        model = c.target if target_side else c.draft
        make = model.make_cache

        def made():
            cache = make()
            real = cache.crop
            cache.crop = lambda length: crop(cache, length, real)
            return cache

        c.patch(model, "make_cache", made)

    return change


def _keep_last(cache, length, real) -> None:
    """crop(n) keeping the last n positions of each layer instead of the first n."""
    for i, n in enumerate(cache._len):
        if cache._k[i] is not None and n > length:
            cache._k[i][:, :, :length] = cache._k[i][:, :, n - length : n].clone()
            cache._v[i][:, :, :length] = cache._v[i][:, :, n - length : n].clone()
    real(length)


def _masks_stripped(prompt_too: bool):
    """The loop's output with every token equal to mask_token_id taken out (of the prompt too, or of the new
    tokens alone): a port that filters its output buffer, whose unfilled slots hold the mask token."""

    def make(original):
        def generate(draft, target, input_ids, *args, **kwargs):
            result = original(draft, target, input_ids, *args, **kwargs)
            ids, start = result.output_ids[0], 0 if prompt_too else input_ids.shape[1]
            kept = torch.cat([ids[:start], ids[start:][ids[start:] != draft.mask_token_id]])
            result.output_ids = kept[None]  # (1, kept)
            return result

        return generate

    return make


def _stop_checked_on_last(original):
    def committed(output_ids, start, tau, max_length, stop_tokens):
        produced = min(tau + 1, max_length - start - 1)
        return produced, bool(torch.isin(output_ids[0, start + produced], stop_tokens))  # the last token only

    return committed


def _stop_never(original):
    return lambda output_ids, start, tau, max_length, stop_tokens: (min(tau + 1, max_length - start - 1), False)


def _pick(conv_from_end: bool, recurrent_from_end: bool):
    """LinearLayerState.pick taking the conv window and/or the recurrent state at the verify's end, not at m."""

    def make(original):
        def pick(self, m, keep_positions):
            if m == 0 or self.inputs is None:
                return original(self, m, keep_positions)
            window = self.inputs.shape[-1] - self.pending  # K − 1
            self.conv = (self.inputs[..., -window:] if conv_from_end else self.inputs[..., m : m + window]).clone()
            last = self.states.shape[2] - 1
            self.recurrent = self.states[:, :, last if recurrent_from_end else min(m - 1, last)].clone()
            self.length += m
            self.inputs = self.states = None
            self.pending = 0

        return pick

    return make


def _conv_time_reversed(original):
    def convolve(x, taps, base, group_size, blocks=1):  # y_t = Σ_j (w_j + a_{t,j}) x_{t+j}: later positions read
        return original(x.flip(1), taps.flip(1), base, group_size, blocks).flip(1)

    return convolve


def _conv_kernel_reversed(original):
    def convolve(x, taps, base, group_size, blocks=1):  # tap j applied to x_{t−(J−1−j)}
        return original(x, taps.flip(2), base.flip(0), group_size, blocks)

    return convolve


def _finish_taps_from_output(c: Change) -> None:
    for layer in c.draft.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):

            def finish(out, taps, blocks=1, conv=conv):
                own = rearrange(conv.kernel_projection(out), "b l (h k g) -> b l h k g", h=2, k=conv.kernel_size)
                return conv.hook_finished(
                    dynamic_conv.convolve(out, own[:, :, 1], conv.base_kernel[1], conv.group_size, blocks)
                )

            c.patch(conv, "finish", finish)


def _finish_with_prepare_taps(c: Change) -> None:
    for layer in c.draft.layers:
        for conv in (layer.attention_conv, layer.mlp_conv):
            prepare = conv.prepare

            def both(x, blocks=1, prepare=prepare, conv=conv):
                prepared, _ = prepare(x, blocks)
                taps = rearrange(conv.kernel_projection(x), "b l (h k g) -> b l h k g", h=2, k=conv.kernel_size)
                return prepared, taps[:, :, 0]  # a⁰ for finish too

            c.patch(conv, "prepare", both)


def _codebooks_swapped(c: Change) -> None:
    s = c.draft.candidate_selector
    s.predecessor_codebook, s.successor_codebook = s.successor_codebook, s.predecessor_codebook


def _walk_from_mask(c: Change) -> None:
    select, mask = c.draft.candidate_selector.select, c.draft.mask_token_id
    c.patch(
        c.draft.candidate_selector,
        "select",
        lambda hidden, logits, anchor_ids, *a, **k: select(hidden, logits, torch.full_like(anchor_ids, mask), *a, **k),
    )


def _argmax_proposals(c: Change) -> None:
    c.patch(c.draft, "choose_tokens", lambda hidden, logits, anchor, *a, **k: (logits.argmax(dim=-1), None, None))


def _embedding_scaled(c: Change) -> None:
    c.patch(c.draft.config, "input_embedding_scale", c.draft.config.hidden_size**0.5)


def _block_without_anchor(c: Change) -> None:
    row = c.target.model.embed_tokens.weight[c.draft.mask_token_id] * c.draft.config.input_embedding_scale  # (d,)

    def make(forward):
        def run(*args, noise_embedding, **kwargs):
            noise = noise_embedding.clone()
            noise[:, 0] = row.to(noise.dtype)  # position 0 embedded as a mask, not x_0
            return forward(*args, noise_embedding=noise, **kwargs)

        return run

    _draft_forward(c, make)


def _head_is_embedding(c: Change) -> None:
    weight = c.target.model.embed_tokens.weight
    compute = c.draft.compute_logits
    c.patch(c.draft, "compute_logits", lambda hidden, head: compute(hidden, lambda h: h @ weight.T))


def _norm_weights_at_one(*paths: str) -> Callable[[Change], None]:
    """The RMSNorm weights at `paths` (relative to the draft, `layers.*.` for every layer) left at their initial
    ones: a loader that did not find them under the name it looked for."""

    def change(c: Change) -> None:
        for path in paths:
            holders = c.draft.layers if path.startswith("layers.*.") else [c.draft]
            for holder in holders:
                norm = holder.get_submodule(path.removeprefix("layers.*."))
                norm.weight.data.fill_(1.0)

    return change


def _not_ones(path: str) -> Callable:
    def differs(draft, target) -> bool:
        holder = draft.layers[0] if path.startswith("layers.*.") else draft
        return not bool((holder.get_submodule(path.removeprefix("layers.*.")).weight == 1).all())

    return differs


def _ids(rule: Callable[[int, int], list[int]]) -> Callable[[Change], None]:
    def change(c: Change) -> None:
        c.draft.config.target_layer_ids = rule(c.target.config.num_hidden_layers, len(c.draft.target_layer_ids))

    return change


def _ids_differ(rule) -> Callable:
    return lambda draft, target: (
        rule(target.config.num_hidden_layers, len(draft.target_layer_ids)) != list(draft.target_layer_ids)
    )


def _truncated_ids(layers: int, n: int) -> list[int]:
    if n == 1:
        return [layers // 2]
    return [int(1 + i * (layers - 4) / (n - 1)) for i in range(n)]


def _scaled(draft, target) -> bool:
    return draft.rotary_emb.scaling is not None


def _target_scaled(draft, target) -> bool:
    return getattr(target, "rotary_emb", None) is not None and target.rotary_emb.scaling is not None


def _differs(a: Callable, b: Callable) -> Callable:
    return lambda draft, target: not torch.equal(a(draft, target), b(draft, target))


CATALOGUE: list[Cause] = [
    # -- the target, before any draft stage
    Cause(
        "target-final-norm-skipped",
        "prefill_logits",
        "the target's final RMSNorm is not applied before lm_head",
        lambda c: setattr(c.target.model, "norm", nn.Identity()),
    ),
    Cause(
        "target-head-tied-wrongly",
        "prefill_logits",
        "the target's lm_head is read as its tied embedding though its config unties them",
        lambda c: setattr(c.target.lm_head, "weight", c.target.model.embed_tokens.weight),
        _differs(lambda d, t: t.lm_head.weight, lambda d, t: t.model.embed_tokens.weight),
    ),
    Cause(
        "target-rope-theta-default",
        "prefill_logits",
        "the target's RoPE base taken as 10000 (the config's rope_theta / rope_parameters not read)",
        lambda c: setattr(c.target, "rotary_emb", _rope(c.target.rotary_emb, theta=10000.0)),
        lambda d, t: getattr(t, "rotary_emb", None) is not None and t.rotary_emb.rope_theta != 10000.0,
        shows_on="long_context",
    ),
    Cause(
        "target-rope-scaling-dropped",
        "prefill_logits",
        "the target's RoPE scaling not applied (read from one spelling of the config, rope_scaling or "
        "rope_parameters, which this config does not use)",
        lambda c: setattr(c.target, "rotary_emb", _rope(c.target.rotary_emb, scaling=None)),
        _target_scaled,
        shows_on="rope_yarn",
    ),
    Cause(
        "target-qk-norm-skipped",
        "prefill_logits",
        "the target's q_norm and k_norm (Qwen3's) are not applied",
        _no_q_k_norm_target,
        lambda d, t: getattr(t.model.layers[0].self_attn, "q_norm", None) is not None,
    ),
    # -- which target layers feed the draft, and how
    Cause(
        "layer-ids-from-formula",
        "layer_ids",
        "target_layer_ids computed by the formula round(1 + i·(L − 4)/(n − 1)) though the draft's config gives them",
        _ids(build_target_layer_ids),
        _ids_differ(build_target_layer_ids),
        shows_on="stop_token",
    ),
    Cause(
        "layer-ids-truncated",
        "layer_ids",
        "target_layer_ids computed with int() (truncation) where the formula rounds",
        _ids(_truncated_ids),
        _ids_differ(_truncated_ids),
        shows_on="stop_token",
    ),
    Cause(
        "hidden-states-off-by-one",
        "target_hidden",
        "layer l read at hidden_states[l] (index 0 is the embedding output), not hidden_states[l + 1]",
        _wrap(decoding, "extract_context_feature", _features(lambda hs, ids: [hs[i] for i in ids])),
    ),
    Cause(
        "hidden-states-one-too-deep",
        "target_hidden",
        "layer l read at hidden_states[l + 2]",
        _wrap(
            decoding,
            "extract_context_feature",
            _features(lambda hs, ids: [hs[min(i + HIDDEN_STATE_OFFSET + 1, len(hs) - 1)] for i in ids]),
        ),
    ),
    Cause(
        "features-concatenated-in-reverse",
        "target_hidden",
        "the sampled layers' features concatenated in reverse order of target_layer_ids",
        _wrap(
            decoding,
            "extract_context_feature",
            _features(lambda hs, ids: [hs[i + HIDDEN_STATE_OFFSET] for i in reversed(ids)]),
        ),
        lambda d, t: len(set(d.target_layer_ids)) > 1,
    ),
    Cause(
        "features-from-the-verify-end",
        "target_hidden",
        "after a verify, the new context's features taken from the verify's last τ + 1 positions ([-n:]) "
        "instead of its first, the committed tokens'",
        _wrap(decoding, "committed_features", _from_the_end),
    ),
    # -- the context C = hidden_norm(fc(features))
    Cause(
        "hidden-norm-skipped",
        "context",
        "C = fc(features), without the hidden_norm RMSNorm",
        lambda c: setattr(c.draft, "hidden_norm", nn.Identity()),
    ),
    Cause(
        "hidden-norm-with-final-norm-weight",
        "context",
        "hidden_norm loaded with the draft's final norm's weight",
        lambda c: setattr(c.draft.hidden_norm, "weight", c.draft.norm.weight),
        _differs(lambda d, t: d.hidden_norm.weight, lambda d, t: d.norm.weight),
        shows_on="multiround",
    ),
    Cause(
        "hidden-norm-weight-not-loaded",
        "context",
        "hidden_norm's weight not loaded: left at its initial ones",
        _norm_weights_at_one("hidden_norm"),
        _not_ones("hidden_norm"),
        shows_on="multiround",
    ),
    # -- the block and its embedding
    Cause(
        "block-without-anchor",
        "noise_embedding",
        "the block embedded as all mask tokens: x_0 not put at position 0",
        _block_without_anchor,
    ),
    Cause(
        "embedding-scaled-by-sqrt-d",
        "noise_embedding",
        "the block's embedding multiplied by √d (a Gemma habit)",
        _embedding_scaled,
        lambda d, t: d.config.input_embedding_scale == 1.0,
    ),
    # -- DFlash 2's convolutions
    Cause(
        "conv-reads-later-positions",
        "attn_conv_in",
        "the dynamic convolution reads x_{t+j} (later positions) instead of x_{t−j}",
        _wrap(dynamic_conv, "convolve", _conv_time_reversed),
        _version(2),
        shows_on="dflash2",
    ),
    Cause(
        "conv-kernel-reversed",
        "attn_conv_in",
        "the convolution's taps applied in reverse order (tap j to x_{t−(J−1−j)})",
        _wrap(dynamic_conv, "convolve", _conv_kernel_reversed),
        _version(2),
        shows_on="dflash2",
    ),
    Cause(
        "finish-taps-from-output",
        "attn_conv_out",
        "finish's taps computed from the sublayer's output instead of its input",
        _finish_taps_from_output,
        _version(2),
        shows_on="dflash2",
    ),
    Cause(
        "finish-with-prepare-taps",
        "attn_conv_out",
        "finish convolves with the prepare taps a⁰ instead of a¹",
        _finish_with_prepare_taps,
        _version(2),
        shows_on="dflash2",
    ),
    # -- the draft's attention
    Cause(
        "input-norm-skipped",
        "q",
        "the draft layer's input RMSNorm is not applied before the attention",
        lambda c: [setattr(layer, "input_layernorm", nn.Identity()) for layer in c.draft.layers],
        _version(1),
        also=("v",),
    ),
    Cause("q-norm-skipped", "q", "Q is not normed per head (q_norm missing)", _set_on_attentions(q_norm=nn.Identity())),
    Cause(
        "q-norm-with-k-norm-weight",
        "q",
        "q_norm loaded with k_norm's weight",
        _set_on_attentions(q_norm=lambda a: a.k_norm),
        _differs(lambda d, t: d.layers[0].self_attn.q_norm.weight, lambda d, t: d.layers[0].self_attn.k_norm.weight),
        shows_on="multiround",
    ),
    Cause(
        "q-norm-weight-not-loaded",
        "q",
        "q_norm's weight not loaded: left at its initial ones",
        _norm_weights_at_one("layers.*.self_attn.q_norm"),
        _not_ones("layers.*.self_attn.q_norm"),
        shows_on="multiround",
    ),
    Cause(
        "k-norm-skipped",
        "k_ctx",
        "K is not normed per head (k_norm missing), context and block",
        _set_on_attentions(k_norm=nn.Identity()),
    ),
    Cause(
        "k-norm-on-block-only",
        "k_ctx",
        "k_norm applied to the block's K but not to the context's",
        _set_on_attentions(k_norm=lambda a: _Alternate(a.k_norm, on_first=False)),
    ),
    Cause(
        "k-norm-on-context-only",
        "k_noise",
        "k_norm applied to the context's K but not to the block's",
        _set_on_attentions(k_norm=lambda a: _Alternate(a.k_norm, on_first=True)),
    ),
    Cause(
        "k-norm-weight-not-loaded",
        "k_ctx",
        "k_norm's weight not loaded: left at its initial ones",
        _norm_weights_at_one("layers.*.self_attn.k_norm"),
        _not_ones("layers.*.self_attn.k_norm"),
        shows_on="multiround",
    ),
    Cause(
        "rope-block-positions-from-zero",
        "q_rot",
        "the block rotated at positions 0 … L_q − 1 instead of start … start + L_q − 1",
        lambda c: _draft_forward(c, _block_positions_from_zero),
    ),
    Cause(
        "rope-positions-off-by-one",
        "q_rot",
        "every draft position one too far (counted from 1)",
        lambda c: _draft_forward(c, _positions_plus_one),
    ),
    Cause(
        "rope-query-rows-from-front",
        "q_rot",
        "Q rotated with the first L_q rows of the RoPE tables (the context's positions) instead of the last L_q",
        _wrap(attention, "apply_sliced_rope", _rope_query_from_front),
    ),
    Cause(
        "rope-interleaved-pairs",
        "q_rot",
        "RoPE rotating interleaved pairs (x_0, x_1), (x_2, x_3)… (GPT-J style) instead of halves (rotate_half)",
        _wrap(attention, "apply_sliced_rope", _rope_interleaved),
    ),
    Cause(
        "draft-rope-theta-default",
        "q_rot",
        "the draft's RoPE base taken as 10000 (its config's not read)",
        lambda c: setattr(c.draft, "rotary_emb", _rope(c.draft.rotary_emb, theta=10000.0)),
        lambda d, t: d.rotary_emb.rope_theta != 10000.0,
        shows_on="long_context",
    ),
    Cause(
        "draft-rope-scaling-dropped",
        "q_rot",
        "the draft's RoPE scaling not applied (one spelling of the config read)",
        lambda c: setattr(c.draft, "rotary_emb", _rope(c.draft.rotary_emb, scaling=None)),
        _scaled,
        shows_on="rope_yarn",
    ),
    Cause(
        "causal-block",
        "pattern",
        "the block attends causally (a query sees no later block position) on a full-attention layer",
        _set_on_attentions(is_causal=True),
        lambda d, t: any(not a.self_attn.is_causal for a in d.layers),
    ),
    Cause(
        "attention-scale-1-over-d",
        "pattern",
        "scores scaled by 1/d_h instead of 1/√d_h",
        _set_on_attentions(scaling=lambda a: a.head_dim**-1.0),
    ),
    Cause(
        "gqa-heads-interleaved",
        "pattern",
        "query head h reads KV head h mod H_kv (KV heads tiled) instead of h // (H_q / H_kv) (repeated)",
        _wrap(attention, "attend", _gqa_interleaved),
        lambda d, t: 1 < d.config.num_key_value_heads < d.config.num_attention_heads,
        shows_on="multiround",
    ),
    Cause(
        "window-one-wider",
        "pattern",
        "a sliding window of W + 1 keys (q − k ≤ W) where the config means W",
        _set_on_attentions(sliding_window=lambda a: None if a.sliding_window is None else a.sliding_window + 1),
        _sliding,
        shows_on="gqa_sliding",
    ),
    Cause(
        "window-ignored",
        "pattern",
        "the sliding window not applied: every layer attends every key",
        _set_on_attentions(sliding_window=None),
        _sliding,
        shows_on="gqa_sliding",
    ),
    Cause(
        "window-read-as-causal",
        "pattern",
        "the sliding window read as causal (k ≤ q, q − k < W)",
        _window_as("causal"),
        _window_other_than("causal"),
        shows_on="window_symmetric",
    ),
    Cause(
        "window-read-as-symmetric",
        "pattern",
        "the sliding window read as symmetric (|q − k| < W)",
        _window_as("symmetric"),
        _window_other_than("symmetric"),
        shows_on="gqa_sliding",
    ),
    Cause(
        "window-read-as-rotating",
        "pattern",
        "the sliding window read as rotating (it bounds the context alone)",
        _window_as("rotating"),
        _window_other_than("rotating"),
        shows_on="gqa_sliding",
    ),
    Cause(
        "no-attention-mask",
        "pattern",
        "no mask at all: every query attends every key (the block causally where a layer is causal, and the "
        "sliding window, both dropped)",
        _set_on_attentions(is_causal=False, sliding_window=None, rotating=False),
        lambda d, t: any(a.self_attn.is_causal or a.self_attn.sliding_window is not None for a in d.layers),
        shows_on="gqa_sliding",
    ),
    Cause(
        "heads-transposed-before-o-proj",
        "attn_out",
        "the heads' outputs flattened as (d_h, H) instead of (H, d_h) before o_proj",
        _heads_transposed,
        lambda d, t: d.config.num_attention_heads > 1,
    ),
    # -- the rest of the layer, the final norm and the logits
    Cause(
        "no-residual-after-attention",
        "layer_out",
        "H' = Attn(RMSNorm(H)): the residual H not added back",
        _no_attention_residual,
        _version(1),
    ),
    Cause(
        "post-attention-norm-skipped",
        "layer_out",
        "the MLP's input RMSNorm (post_attention_layernorm) not applied",
        lambda c: [setattr(layer, "post_attention_layernorm", nn.Identity()) for layer in c.draft.layers],
        _version(1),
    ),
    Cause("mlp-gelu", "layer_out", "the MLP's activation GELU instead of SiLU", _gelu_mlp, _version(1)),
    Cause(
        "mlp-gate-up-swapped", "layer_out", "gate_proj and up_proj swapped in the MLP", _gate_up_swapped, _version(1)
    ),
    Cause(
        "draft-final-norm-skipped",
        "final_hidden",
        "the draft's final RMSNorm not applied",
        lambda c: setattr(c.draft, "norm", nn.Identity()),
    ),
    Cause(
        "draft-final-norm-weight-not-loaded",
        "final_hidden",
        "the draft's final norm weight not loaded: left at its initial ones",
        _norm_weights_at_one("norm"),
        _not_ones("norm"),
        shows_on="multiround",
    ),
    Cause(
        "logits-from-first-positions",
        "logits",
        "proposals read at block positions 0 … L_q − 2 ([:, :-1]) instead of 1 … L_q − 1 ([:, 1:])",
        lambda c: _draft_forward(c, _logits_from_first_positions),
    ),
    Cause(
        "draft-head-is-embedding",
        "logits",
        "the draft's logits from the target's embedding (tied) though the target unties lm_head",
        _head_is_embedding,
        _differs(lambda d, t: t.lm_head.weight, lambda d, t: t.model.embed_tokens.weight),
    ),
    # -- DFlash 2's candidate selector
    Cause(
        "codebooks-swapped",
        "pair",
        "the selector's predecessor and successor codebooks swapped",
        _codebooks_swapped,
        _version(2),
        shows_on="dflash2",
    ),
    Cause(
        "selector-walk-from-mask",
        "pair",
        "the selector's walk starts from the mask token instead of the anchor x_0",
        _walk_from_mask,
        _version(2),
        shows_on="dflash2",
    ),
    Cause(
        "selector-skipped",
        "draft_tokens",
        "DFlash 2's proposals taken as the argmax of the draft logits (the candidate selector not run)",
        _argmax_proposals,
        _version(2),
        shows_on="dflash2",
    ),
    # -- the loop
    Cause(
        "tau-counts-matches",
        "acceptance_length",
        "τ counted as the number of matching proposals anywhere, not the length of the leading run",
        _wrap(decoding, "verify_block", _verify_block(_count_matches)),
        shows_on="multiround",
    ),
    Cause(
        "tau-compares-same-position",
        "acceptance_length",
        "d_i compared with the target's token at position i (posterior_i) instead of i − 1",
        _wrap(decoding, "verify_block", _verify_block(_same_position)),
        shows_on="multiround",
    ),
    Cause(
        "bonus-from-draft",
        "bonus",
        "the bonus taken from the draft's next proposal, not the target's posterior[τ]",
        _wrap(decoding, "verify_block", _verify_block(_bonus_from_draft)),
    ),
    Cause(
        "target-cache-not-cropped",
        "verify_logits",
        "the target's KV cache not cropped after a verify: the rejected proposals' K/V stay attended",
        _cache_crop(True, lambda cache, length, real: None),
        lambda d, t: not _hybrid(d, t),
    ),
    Cause(
        "target-cache-cropped-one-short",
        "verify_logits",
        "the target's cache cropped one position short of the committed tokens (start + τ)",
        _cache_crop(True, lambda cache, length, real: real(max(length - 1, 0))),
        lambda d, t: not _hybrid(d, t),
    ),
    Cause(
        "target-cache-cropped-one-long",
        "verify_logits",
        "the target's cache cropped one position past the committed tokens (start + τ + 2)",
        _cache_crop(True, lambda cache, length, real: real(min(length + 1, cache.get_seq_length()))),
        lambda d, t: not _hybrid(d, t),
    ),
    Cause(
        "draft-cache-not-cropped",
        "k_rot",
        "the draft's cache not cropped after its pass: the block's K/V stay",
        _cache_crop(False, lambda cache, length, real: None),
    ),
    Cause(
        "draft-cache-cropped-from-the-end",
        "k_rot",
        "the draft's cache cropped by keeping its last `start` positions instead of its first",
        _cache_crop(False, _keep_last),
    ),
    Cause(
        "recurrent-state-not-rolled-back",
        "recurrent_state",
        "a hybrid target's recurrent state left at the verify's last position (a crop-only rollback): the "
        "rejected tokens stay folded in",
        _wrap(LinearLayerState, "pick", _pick(False, True)),
        _hybrid,
        shows_on="hybrid_target",
    ),
    Cause(
        "conv-window-from-verify-end",
        "conv_state",
        "a hybrid target's conv window taken as the verify's last K − 1 inputs, not the committed ones",
        _wrap(LinearLayerState, "pick", _pick(True, False)),
        _hybrid,
        shows_on="hybrid_target",
    ),
    Cause(
        "mask-tokens-stripped",
        "output_ids",
        "every token equal to mask_token_id taken out of the output, the prompt's too (an output buffer filled with "
        "the mask token, filtered at the end)",
        _wrap(reference, "spec_generate", _masks_stripped(prompt_too=True)),
        shows_on="multiround",
    ),
    Cause(
        "mask-tokens-stripped-after-the-prompt",
        "output_ids",
        "every new token equal to mask_token_id taken out of the output (an output buffer filled with the mask "
        "token, filtered after the prompt)",
        _wrap(reference, "spec_generate", _masks_stripped(prompt_too=False)),
        shows_on="multiround",
    ),
    Cause(
        "stop-checked-on-last-token",
        "output_ids",
        "a stop token looked for only at the end of the committed run, not inside the accepted tokens",
        _wrap(decoding, "_committed", _stop_checked_on_last),
        shows_on="stop_inside",
    ),
    Cause(
        "stop-token-ignored",
        "output_ids",
        "stop tokens not honoured: decoding runs to max_new_tokens",
        _wrap(decoding, "_committed", _stop_never),
        shows_on="stop_token",
    ),
]

BY_NAME = {cause.name: cause for cause in CATALOGUE}
