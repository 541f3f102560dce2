"""KV-injection attention: the visibility mask, the shared `attend` kernel, and the draft attention.

Q = QNorm(H W_Q);  K = KNorm(concat[C W_K, H W_K]);  V = concat[C W_V, H W_V]
Attn = softmax(Q Kᵀ / √d_h) V        non-causal, GQA
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import draft_config, randomize_

from dflash_ref.attention import KVInjectionAttention, attend, visibility_mask
from dflash_ref.cache import KVCache
from dflash_ref.config import ConfigError, DraftConfig
from dflash_ref.hooks import HookPoint, hook_points, hooks, name_hook_points
from dflash_ref.rope import RotaryEmbedding

T, F = True, False
LN3 = math.log(3.0)


# ---------------------------------------------------------------- visibility_mask


def test_non_causal_without_window_is_unmasked():
    assert visibility_mask(4, 7, is_causal=False, sliding_window=None, device=torch.device("cpu")) is None


def test_causal_mask_with_a_cache_offset():
    # L_q = 2 queries are the last two of L_k = 4 keys: positions 2 and 3
    # query at 2 sees keys 0..2, query at 3 sees 0..3
    mask = visibility_mask(2, 4, is_causal=True, sliding_window=None, device=torch.device("cpu"))
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[T, T, T, F], [T, T, T, T]]
    # no offset: the plain lower triangle
    assert visibility_mask(3, 3, is_causal=True, sliding_window=None, device=torch.device("cpu")).tolist() == [
        [T, F, F],
        [T, T, F],
        [T, T, T],
    ]


def test_sliding_window_causal():
    # window 2, causal: query at p sees keys p − 1 and p (distance q − k < 2)
    mask = visibility_mask(2, 4, is_causal=True, sliding_window=2, device=torch.device("cpu"))
    assert mask.tolist() == [[F, T, T, F], [F, F, T, T]]


def test_sliding_window_non_causal_masks_both_directions():
    # window 2, non-causal: |q − k| < 2. Query at 2 sees 1, 2, 3; query at 3 sees 2, 3
    mask = visibility_mask(2, 4, is_causal=False, sliding_window=2, device=torch.device("cpu"))
    assert mask.tolist() == [[F, T, T, T], [F, F, T, T]]
    # a wide window masks nothing
    assert visibility_mask(2, 4, is_causal=False, sliding_window=10, device=torch.device("cpu")).all()


def test_rotating_window_bounds_only_the_context():
    # 2 context keys (0, 1), then a block of 3 (2, 3, 4); window 2. Context: q − k < 2 (query 2 sees key
    # 1, later queries none); block keys: all (non-causal) or k ≤ q (causal), with no window
    cpu = torch.device("cpu")
    mask = visibility_mask(3, 5, is_causal=False, sliding_window=2, device=cpu, rotating=True)
    assert mask.tolist() == [[F, T, T, T, T], [F, F, T, T, T], [F, F, T, T, T]]
    mask = visibility_mask(3, 5, is_causal=True, sliding_window=2, device=cpu, rotating=True)
    assert mask.tolist() == [[F, T, T, F, F], [F, F, T, T, F], [F, F, T, T, T]]
    # the causal window itself hides block key 2 from query 4 (distance 2)
    assert visibility_mask(3, 5, is_causal=True, sliding_window=2, device=cpu)[2].tolist() == [F, F, F, T, T]


# ---------------------------------------------------------------- attend


def t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_equal_scores_average_the_values():
    # 1 head, d_h = 2, two keys equal → scores equal → weights [½, ½] → out = mean of V = [4, 2]
    q = t([[[[1.0, 0.0]]]])  # (1, 1, 1, 2)
    k = t([[[[1.0, 0.0], [1.0, 0.0]]]])  # (1, 1, 2, 2)
    v = t([[[[2.0, 4.0], [6.0, 0.0]]]])
    out, weights = attend(q, k, v, None, 2**-0.5, explicit=True)
    assert weights.tolist() == [[[[0.5, 0.5]]]]
    assert out.tolist() == [[[[4.0, 2.0]]]]


def test_softmax_weights_by_hand():
    # scaling 1, scores [ln 3, 0] → softmax [3/4, 1/4]; V = [[4, 0], [0, 8]] → [3, 2]
    q = t([[[[1.0, 0.0]]]])
    k = t([[[[LN3, 0.0], [0.0, 5.0]]]])
    v = t([[[[4.0, 0.0], [0.0, 8.0]]]])
    out, weights = attend(q, k, v, None, 1.0, explicit=True)
    torch.testing.assert_close(weights, t([[[[0.75, 0.25]]]]))
    torch.testing.assert_close(out, t([[[[3.0, 2.0]]]]))
    # the scaling multiplies the scores: scaling 2 → [2 ln 3, 0] → [9/10, 1/10] → [3.6, 0.8]
    out, weights = attend(q, k, v, None, 2.0, explicit=True)
    torch.testing.assert_close(weights, t([[[[0.9, 0.1]]]]))
    torch.testing.assert_close(out, t([[[[3.6, 0.8]]]]))


def test_masked_keys_get_zero_weight():
    q = t([[[[1.0, 0.0]]]])
    k = t([[[[LN3, 0.0], [0.0, 0.0]]]])
    v = t([[[[4.0, 0.0], [0.0, 8.0]]]])
    out, weights = attend(q, k, v, torch.tensor([[F, T]]), 1.0, explicit=True)
    assert weights.tolist() == [[[[0.0, 1.0]]]]
    assert out.tolist() == [[[[0.0, 8.0]]]]


def test_gqa_query_head_h_reads_kv_head_h_over_groups():
    # H_q = 4, H_kv = 2 → groups = 2: query heads 0, 1 read KV head 0; heads 2, 3 read KV head 1
    # (an interleaved h % H_kv grouping would pair heads 0, 2 instead)
    # every query is [1, 0], scaling 1:
    #   KV head 0 keys [[ln 3, 0], [0, 0]] → weights [3/4, 1/4] → V [[4, 0], [0, 8]] → [3, 2]
    #   KV head 1 keys [[0, 0], [ln 3, 0]] → weights [1/4, 3/4] → V [[4, 0], [0, 8]] → [1, 6]
    q = t([1.0, 0.0]).expand(1, 4, 1, 2)
    k = t([[[[LN3, 0.0], [0.0, 0.0]], [[0.0, 0.0], [LN3, 0.0]]]])  # (1, 2, 2, 2)
    v = t([[4.0, 0.0], [0.0, 8.0]]).expand(1, 2, 2, 2)
    out, weights = attend(q, k, v, None, 1.0, explicit=True)
    assert out.shape == (1, 4, 1, 2) and weights.shape == (1, 4, 1, 2)
    expected = t([[[[3.0, 2.0]], [[3.0, 2.0]], [[1.0, 6.0]], [[1.0, 6.0]]]])
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(weights[0, :, 0], t([[0.75, 0.25], [0.75, 0.25], [0.25, 0.75], [0.25, 0.75]]))
    # the SDPA path groups heads the same way
    sdpa_out, sdpa_weights = attend(q, k, v, None, 1.0, explicit=False)
    assert sdpa_weights is None
    torch.testing.assert_close(sdpa_out, expected)


@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 2), (False, 2)])
@pytest.mark.parametrize("heads", [(4, 2), (4, 4), (6, 1)])
def test_explicit_and_sdpa_paths_agree(causal, window, heads):
    h_q, h_kv = heads
    g = torch.Generator().manual_seed(h_q * 10 + h_kv)
    q = torch.randn(2, h_q, 3, 8, generator=g)
    k = torch.randn(2, h_kv, 5, 8, generator=g)
    v = torch.randn(2, h_kv, 5, 8, generator=g)
    mask = visibility_mask(3, 5, is_causal=causal, sliding_window=window, device=q.device)
    explicit, weights = attend(q, k, v, mask, 8**-0.5, explicit=True)
    sdpa, _ = attend(q, k, v, mask, 8**-0.5, explicit=False)
    torch.testing.assert_close(explicit, sdpa, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, h_q, 3))
    if mask is not None:
        assert (weights[:, :, ~mask] == 0).all()


def test_attend_hooks_see_masked_scores_and_weights():
    seen = {}
    scores_hook, pattern_hook = HookPoint(), HookPoint()
    scores_hook.register_forward_hook(lambda m, a, out: seen.__setitem__("scores", out.clone()))
    pattern_hook.register_forward_hook(lambda m, a, out: seen.__setitem__("pattern", out.clone()))
    q = t([[[[1.0, 0.0]]]])
    k = t([[[[LN3, 0.0], [0.0, 0.0]]]])
    v = t([[[[4.0, 0.0], [0.0, 8.0]]]])
    attend(q, k, v, torch.tensor([[T, F]]), 1.0, explicit=True, scores_hook=scores_hook, pattern_hook=pattern_hook)
    assert seen["scores"][0, 0, 0, 0].item() == pytest.approx(LN3)
    assert seen["scores"][0, 0, 0, 1].item() == float("-inf")
    assert seen["pattern"].tolist() == [[[[1.0, 0.0]]]]


# ---------------------------------------------------------------- KVInjectionAttention

L_C, L_Q = 3, 4


def injection_setup(seed: int = 0, **overrides):
    config = draft_config(**overrides)  # hidden 32, H_q 4, H_kv 2, d_h 8
    attn = randomize_(KVInjectionAttention(config, 0), seed)
    name_hook_points(attn, "attn")
    g = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randn(1, L_Q, config.hidden_size, generator=g)  # H
    context = torch.randn(1, L_C, config.hidden_size, generator=g)  # C
    rope = RotaryEmbedding(config.head_dim, config.rope_theta)
    pos = rope(torch.arange(L_C + L_Q)[None], torch.float32)
    return attn, hidden, context, pos


def run_recording(attn, hidden, context, pos, cache=None):
    seen: dict[str, torch.Tensor] = {}
    with hooks(attn, lambda x, point: seen.__setitem__(point.name.split(".")[-1], x.detach().clone())):
        out, weights = attn(hidden, context, pos, cache)
    return out, weights, seen


def test_hook_shapes_and_pattern_rows():
    attn, hidden, context, pos = injection_setup()
    out, weights, seen = run_recording(attn, hidden, context, pos)
    assert out.shape == (1, L_Q, 32)
    assert seen["hook_q"].shape == (1, 4, L_Q, 8)  # Q: the block only
    assert seen["hook_k_ctx"].shape == (1, 2, L_C, 8)
    assert seen["hook_k_noise"].shape == (1, 2, L_Q, 8)
    assert seen["hook_v"].shape == (1, 2, L_C + L_Q, 8)
    assert seen["hook_k_rot"].shape == (1, 2, L_C + L_Q, 8)  # K length L_c + L_q
    assert seen["hook_pattern"].shape == (1, 4, L_Q, L_C + L_Q)
    assert seen["hook_scores"].shape == (1, 4, L_Q, L_C + L_Q)
    torch.testing.assert_close(seen["hook_pattern"].sum(-1), torch.ones(1, 4, L_Q))
    # with hooks on the pattern the explicit path runs and returns the same weights
    torch.testing.assert_close(weights, seen["hook_pattern"])
    torch.testing.assert_close(seen["hook_out"], out)


def test_draft_attention_is_non_causal():
    attn, hidden, context, pos = injection_setup()
    assert attn.is_causal is False and attn.sliding_window is None
    _, _, seen = run_recording(attn, hidden, context, pos)
    pattern = seen["hook_pattern"]
    # block position 0 attends to the *last* block position (key L_c + L_q − 1) with non-zero weight
    assert (pattern[0, :, 0, L_C + L_Q - 1] > 0).all()
    # and no entry is masked at all: every weight is positive
    assert (pattern > 0).all()


def test_q_and_k_noise_come_from_the_block_only():
    attn, hidden, context, pos = injection_setup()
    _, _, a = run_recording(attn, hidden, context, pos)
    _, _, b = run_recording(attn, hidden, context * -3.0 + 1.0, pos)
    assert torch.equal(a["hook_q"], b["hook_q"])
    assert torch.equal(a["hook_k_noise"], b["hook_k_noise"])
    assert torch.equal(a["hook_v"][:, :, L_C:], b["hook_v"][:, :, L_C:])  # v_noise
    assert not torch.allclose(a["hook_k_ctx"], b["hook_k_ctx"])
    assert not torch.allclose(a["hook_v"][:, :, :L_C], b["hook_v"][:, :, :L_C])  # v_ctx
    # and the context half of K does not depend on the block
    _, _, c = run_recording(attn, hidden + 1.0, context, pos)
    assert torch.equal(a["hook_k_ctx"], c["hook_k_ctx"])
    assert not torch.allclose(a["hook_q"], c["hook_q"])


def test_q_k_v_are_the_projections_of_the_equation():
    attn, hidden, context, pos = injection_setup()
    _, _, seen = run_recording(attn, hidden, context, pos)

    def heads(x):  # (1, L, h·8) → (1, h, L, 8)
        return x.view(1, x.shape[1], -1, 8).transpose(1, 2)

    with torch.no_grad():
        torch.testing.assert_close(seen["hook_q"], attn.q_norm(heads(attn.q_proj(hidden))))
        torch.testing.assert_close(seen["hook_k_ctx"], attn.k_norm(heads(attn.k_proj(context))))
        torch.testing.assert_close(seen["hook_v"], heads(attn.v_proj(torch.cat([context, hidden], 1))))


def test_sdpa_path_matches_explicit_path():
    attn, hidden, context, pos = injection_setup(seed=3)
    with torch.no_grad():
        fast, no_weights = attn(hidden, context, pos)  # no hooks: SDPA
        assert no_weights is None
        attn.use_sdpa = False
        slow, weights = attn(hidden, context, pos)
    assert weights.shape == (1, 4, L_Q, L_C + L_Q)
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)


def test_cache_prepends_earlier_context():
    attn, hidden, context, pos = injection_setup(seed=4)
    cache = KVCache(1)
    cache.update(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), 0)  # 5 earlier positions
    _, weights, seen = run_recording(attn, hidden, context, pos, cache)
    assert seen["hook_k_rot"].shape == (1, 2, 5 + L_C + L_Q, 8)
    assert weights.shape == (1, 4, L_Q, 5 + L_C + L_Q)
    assert cache.length == 5 + L_C + L_Q


def test_sliding_layers_follow_the_official_causality_rule():
    layer_types = ["sliding_attention", "full_attention"]
    config = draft_config(layer_types=layer_types, sliding_window=2)
    sliding, full = KVInjectionAttention(config, 0), KVInjectionAttention(config, 1)
    assert (sliding.is_causal, sliding.sliding_window) == (True, 2)
    assert (full.is_causal, full.sliding_window) == (False, None)
    config = draft_config(layer_types=layer_types, sliding_window=2, is_causal=False)
    assert KVInjectionAttention(config, 0).is_causal is False and config.window_kind == "symmetric"
    config = draft_config(layer_types=layer_types, sliding_window=2, sliding_window_kind="rotating")
    assert KVInjectionAttention(config, 0).rotating and not KVInjectionAttention(config, 1).rotating


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(sliding_window_kind="sinks"), "not one of"),
        (dict(sliding_window_kind="causal", is_causal=False), "contradicts is_causal=False"),
        (dict(sliding_window_kind="symmetric", is_causal=True), "contradicts is_causal=True"),
    ],
)
def test_window_kind_is_checked(fields, message):
    with pytest.raises(ConfigError, match=message):
        draft_config(layer_types=["sliding_attention", "full_attention"], sliding_window=2, **fields)


def test_window_kind_round_trips_in_dflash_config():
    config = draft_config(
        layer_types=["sliding_attention", "full_attention"], sliding_window=2, sliding_window_kind="rotating"
    )
    d = config.to_dict()
    assert d["dflash_config"]["sliding_window_kind"] == "rotating"
    assert DraftConfig.from_dict(d) == config and "sliding_window_kind" not in draft_config().to_dict()["dflash_config"]


def test_single_head_by_hand():
    # d = d_h = 2, one head, identity W_Q, W_K, W_V, W_O, norm weights 1, eps ≈ 0.
    config = draft_config(
        hidden_size=2,
        intermediate_size=1,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=2,
        rms_norm_eps=1e-12,
        num_target_layers=1,
    )
    attn = KVInjectionAttention(config, 0)
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj):
            proj.weight.copy_(torch.eye(2))
    name_hook_points(attn, "attn")
    hidden = t([[[1.0, 1.0], [1.0, -1.0]]])  # H: L_q = 2
    context = t([[[2.0, 0.0]]])  # C: L_c = 1
    # every position is 7: Q and K are rotated by the same angle, so Q·K is unchanged by RoPE
    pos = RotaryEmbedding(2, 100.0)(torch.full((1, 3), 7), torch.float32)
    #   Q = RMSNorm(H) = [[1, 1], [1, −1]]                     (rms of each row is 1)
    #   K = RMSNorm([C; H]) = [[√2, 0], [1, 1], [1, −1]]        (rms of [2, 0] is √2)
    #   V = [C; H] = [[2, 0], [1, 1], [1, −1]]
    #   scores = Q Kᵀ / √2: row 0 = [√2, 2, 0]/√2 = [1, √2, 0], row 1 = [√2, 0, 2]/√2 = [1, 0, √2]
    #   softmax row 0: e¹ = 2.7182818, e^√2 = 4.1132504, e⁰ = 1, sum 7.8315322
    #                  → [0.3470945, 0.5252166, 0.1276889]; row 1 is the same with keys 1, 2 swapped
    #   out row 0 = 0.3470945·[2, 0] + 0.5252166·[1, 1] + 0.1276889·[1, −1] = [1.3470945, 0.3975276]
    #   out row 1 = 0.3470945·[2, 0] + 0.1276889·[1, 1] + 0.5252166·[1, −1] = [1.3470945, −0.3975276]
    out, weights, seen = run_recording(attn, hidden, context, pos)
    torch.testing.assert_close(seen["hook_q"], t([[[[1.0, 1.0], [1.0, -1.0]]]]), rtol=0, atol=1e-6)
    r2 = math.sqrt(2.0)
    torch.testing.assert_close(
        torch.cat([seen["hook_k_ctx"], seen["hook_k_noise"]], 2),
        t([[[[r2, 0.0], [1.0, 1.0], [1.0, -1.0]]]]),
        rtol=0,
        atol=1e-6,
    )
    torch.testing.assert_close(seen["hook_scores"], t([[[[1.0, r2, 0.0], [1.0, 0.0, r2]]]]), rtol=0, atol=1e-5)
    torch.testing.assert_close(
        weights, t([[[[0.3470945, 0.5252166, 0.1276889], [0.3470945, 0.1276889, 0.5252166]]]]), rtol=0, atol=1e-6
    )
    torch.testing.assert_close(out, t([[[1.3470945, 0.3975276], [1.3470945, -0.3975276]]]), rtol=0, atol=1e-5)
    # RoPE did rotate: the rotated query is not the unrotated one (angle 7 rad on the single pair)
    assert not torch.allclose(seen["hook_q_rot"], seen["hook_q"], atol=1e-3)


def test_hooks_reach_every_point_of_an_unnamed_module():
    attn = KVInjectionAttention(draft_config(), 0)  # built directly, not through DFlashDraftModel
    expected = {
        "hook_q",
        "hook_k_ctx",
        "hook_k_noise",
        "hook_v",
        "hook_q_rot",
        "hook_k_rot",
        "hook_scores",
        "hook_pattern",
        "hook_out",
    }
    assert len(hook_points(attn)) == len(expected)
    with hooks(attn, lambda x, point: None) as attached:
        assert len(attached) == len(expected)
