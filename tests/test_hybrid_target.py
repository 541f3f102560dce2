"""Hybrid targets (Qwen3.5 / 3.6: Gated DeltaNet + gated attention): parity, exact rollback, losslessness.

parity     own Qwen3_5Target == transformers' Qwen3_5ForCausalLM (logits, every hidden state)
rollback   after prefill, verify of L, crop(n + m): every state == a plain forward of the n + m tokens
guard      HFTarget refuses models whose cache a crop cannot roll back (and a crop really fails there)
lossless   spec_generate == generate on hybrid targets, greedy and sampled
"""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_ref import generate, spec_generate
from dflash_ref.config_fields import ConfigError
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.drafts.random_draft import random_draft
from dflash_ref.loading.hf import HFTarget
from dflash_ref.loading.hf_guard import UnrollableTarget
from dflash_ref.loading.hf_hybrid import ReplayCache
from dflash_ref.target import HybridConfig, Qwen3_5Target
from dflash_ref.target.hybrid_cache import HybridCache

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread_module")

L, F = "linear_attention", "full_attention"
MIXES = [[L, L, L, F], [F, L], [L, L, F, F], [L]]


def hf_config(layer_types, **overrides):
    kw = dict(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_conv_kernel_dim=4,
        initializer_range=0.5,
        max_position_embeddings=256,
        layer_types=list(layer_types),
    )
    kw.update(overrides)
    return transformers.Qwen3_5TextConfig(**kw)


def hf_hybrid(layer_types, seed: int = 0, **overrides):
    """A random transformers Qwen3_5ForCausalLM, weights N(0, 0.5²); norm weights, dt_bias and A_log
    jittered too (their init is constant), so that no stage is an accidental identity."""
    torch.manual_seed(seed)
    model = transformers.Qwen3_5ForCausalLM(hf_config(layer_types, **overrides)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "dt_bias", "A_log")):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def qwen3_next(layer_types, seed: int = 0):
    """A random transformers Qwen3NextForCausalLM (Gated DeltaNet + gated attention, MoE MLPs)."""
    torch.manual_seed(seed)
    config = transformers.Qwen3NextConfig(
        vocab_size=32,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=list(layer_types),
        initializer_range=0.5,
        max_position_embeddings=256,
    )
    return transformers.Qwen3NextForCausalLM(config).eval()


def pair(layer_types, seed: int = 0, **overrides):
    hf = hf_hybrid(layer_types, seed, **overrides)
    return hf, Qwen3_5Target.from_hf(hf)


# ---------------------------------------------------------------------------------------------
# Parity with transformers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_types", MIXES)
def test_every_layer_equals_transformers(layer_types):
    """Each decoder layer alone (same input, residual stream of order 10): max error ≤ 1e-5 × scale."""
    hf, ours = pair(layer_types)
    from transformers.masking_utils import create_causal_mask

    x = 3 * torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(5))  # (B, L, d)
    pos = torch.arange(13)[None].expand(2, -1)  # (B, L)
    mask = create_causal_mask(
        config=hf.config, inputs_embeds=x, attention_mask=None, past_key_values=None, position_ids=pos
    )
    with torch.no_grad():
        for theirs_layer, our_layer in zip(hf.model.layers, ours.model.layers):
            theirs = theirs_layer(
                x,
                position_embeddings=hf.model.rotary_emb(x, pos),
                attention_mask=mask if theirs_layer.block_type == F else None,
                position_ids=pos,
            )
            assert_close(our_layer(x, ours.rotary_emb(pos, x.dtype), None), theirs)


@torch.no_grad()
def hf_step_by_step(hf, ids):
    """transformers one token at a time (its recurrent path, not the chunked one): hidden states."""
    cache, rows = transformers.DynamicCache(config=hf.config), []
    for i in range(ids.shape[1]):
        rows.append(
            hf(
                ids[:, i : i + 1],
                position_ids=torch.tensor([[i]]),
                past_key_values=cache,
                use_cache=True,
                output_hidden_states=True,
            )
        )
    return [torch.cat([r.hidden_states[j] for r in rows], 1) for j in range(len(rows[0].hidden_states))], torch.cat(
        [r.logits for r in rows], 1
    )


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("layer_types", MIXES)
def test_whole_model_equals_transformers(layer_types, seed):
    """Logits and every hidden state of a prompt. At N(0, 0.5²) weights the residual stream reaches ~100
    and rounding grows through the linear layers: transformers' own two algorithms (chunked for a prompt,
    recurrent token by token) then differ by up to ~5e-5 × scale, so the bound is 1e-5 × scale or twice
    that self-disagreement, whichever is larger. A float64 run of the own target (no float32 anywhere)
    is the truth both fp32 runs are measured against: ours is no further from it than transformers is."""
    hf, ours = pair(layer_types, seed)
    ids = torch.randint(0, 32, (1, 11), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        theirs, mine = hf(ids, output_hidden_states=True, use_cache=False), ours(ids)
        truth = Qwen3_5Target.from_hf(hf_hybrid(layer_types, seed).double())(ids)
    # transformers cannot run an all-linear model with a cache (get_seq_length needs an attention layer):
    # there the bound is 1e-5 × scale alone
    stepped, stepped_logits = hf_step_by_step(hf, ids) if F in layer_types else (theirs.hidden_states, theirs.logits)
    pairs = list(zip(mine.hidden_states, theirs.hidden_states, stepped, truth.hidden_states))
    pairs.append((mine.logits, theirs.logits, stepped_logits, truth.logits))
    assert len(mine.hidden_states) == len(theirs.hidden_states) == len(layer_types) + 1
    for a, b, c, t in pairs:
        scale = max(1.0, b.abs().max().item())
        self_gap = (b - c).abs().max().item()
        assert (a - b).abs().max().item() <= max(1e-5 * scale, 2 * self_gap)
        assert (a.double() - t).abs().max().item() <= 2 * (b.double() - t).abs().max().item() + 1e-5 * scale


def test_cached_decoding_equals_one_forward():
    """Prefill then one token at a time through the HybridCache == one forward over everything."""
    _, ours = pair([L, F, L])
    ids = torch.randint(0, 32, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = ours(ids).logits
        cache = ours.make_cache()
        rows = [ours(ids[:, :5], past_key_values=cache).logits]
        rows += [ours(ids[:, i : i + 1], past_key_values=cache).logits for i in range(5, 9)]
    assert cache.get_seq_length() == 9 and cache.lengths() == [9, 9, 9]
    assert_close(torch.cat(rows, 1), full)


def test_hook_points_show_the_recurrence():
    """Named hook points: q, k, v, g (decay), β and o per Gated DeltaNet layer; the attention's gate and pattern."""
    from dflash_ref.hooks import hook_points, hooks

    _, ours = pair([L, F])
    names = set(hook_points(ours))
    assert {f"target.model.layers.0.linear_attn.hook_{n}" for n in ("q", "k", "v", "decay", "beta", "output")} | {
        "target.model.layers.1.self_attn.hook_gate",
        "target.model.layers.1.self_attn.hook_pattern",
    } == names
    seen = {}
    with hooks(ours, lambda t, point: seen.update({point.name: t.shape})), torch.no_grad():
        plain = ours(torch.tensor([[1, 2, 3]])).logits
    assert seen["target.model.layers.0.linear_attn.hook_decay"] == (1, 3, 4)  # (B, L, H_v)
    assert seen["target.model.layers.1.self_attn.hook_pattern"] == (1, 4, 3, 3)  # explicit path
    assert_close(ours(torch.tensor([[1, 2, 3]])).logits, plain)


def test_config_and_input_errors_name_the_problem():
    with pytest.raises(ConfigError, match=r"unknown layer type\(s\) \['mamba'\]"):
        HybridConfig.from_hf(dict(hf_config([L, F]).to_dict(), layer_types=[L, "mamba"]))
    with pytest.raises(ConfigError, match="layer_types has 1 entries but num_hidden_layers is 2"):
        HybridConfig.from_hf(dict(hf_config([L, F]).to_dict(), layer_types=[L]))
    with pytest.raises(ConfigError, match="linear_num_value_heads .3. must be a multiple of linear_num_key_heads"):
        HybridConfig.from_hf(dict(hf_config([L]).to_dict(), linear_num_value_heads=3))
    with pytest.raises(ConfigError, match="num_attention_heads .3. must be a multiple of num_key_value_heads"):
        HybridConfig.from_hf(dict(hf_config([F]).to_dict(), num_attention_heads=3))
    with pytest.raises(ConfigError, match="'linear_conv_kernel_dim' must be an integer ≥ 1, got 0"):
        HybridConfig.from_hf(dict(hf_config([L]).to_dict(), linear_conv_kernel_dim=0))
    with pytest.raises(ConfigError, match="rope type 'yarn' is not implemented"):
        HybridConfig.from_hf(dict(hf_config([F]).to_dict(), rope_parameters=dict(rope_type="yarn", rope_theta=1e4)))
    with pytest.raises(TypeError, match="needs a HybridConfig"):
        Qwen3_5Target(hf_config([L]))
    _, ours = pair([L, F])
    with pytest.raises(TypeError, match="needs its own cache"):
        ours(torch.tensor([[1, 2]]), past_key_values=transformers.DynamicCache())
    with pytest.raises(ValueError, match="layer types 'linear_attention' / 'full_attention', got \\['conv'\\]"):
        HybridCache([L, "conv"])
    from dflash_ref.compat import IncompatibleModels, check_pair

    draft = random_draft(ours, num_hidden_layers=1, block_size=4, target_layer_ids=[0, 1])
    draft.config.target_layer_ids = [0, 2]  # a draft made for a deeper target
    with pytest.raises(IncompatibleModels, match=r"target_layer_ids \[0, 2\] include \[2\], beyond"):
        check_pair(draft, ours)


# ---------------------------------------------------------------------------------------------
# The guard: transformers' own hybrids are refused, and a crop really does not roll them back
# ---------------------------------------------------------------------------------------------


def test_hf_target_refuses_models_a_crop_cannot_roll_back():
    """Recurrent models are refused at construction, naming the layer type; transformers' Qwen3.5 hybrids
    with an attention layer are taken, with the snapshot + replay cache (loading/hf_hybrid.py)."""
    with pytest.raises(UnrollableTarget, match="layer type 'linear_attention'.*Qwen3_5GatedDeltaNet.*from_hf"):
        HFTarget(hf_hybrid([L, L]))  # no attention layer: transformers' cache has no length
    mamba = transformers.MambaConfig(vocab_size=32, hidden_size=16, state_size=4, num_hidden_layers=1)
    with pytest.raises(UnrollableTarget, match="MambaMixer"):
        HFTarget(transformers.MambaForCausalLM(mamba))
    lfm2 = transformers.Lfm2Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        layer_types=["conv", "full_attention"],
    )
    with pytest.raises(UnrollableTarget, match="Lfm2ShortConv"):
        HFTarget(transformers.Lfm2ForCausalLM(lfm2))
    with pytest.raises(UnrollableTarget, match="Qwen3NextGatedDeltaNet"):  # all linear: no cache length
        HFTarget(qwen3_next([L, L]))
    assert isinstance(HFTarget(hf_hybrid([L, L, L, F])).make_cache(), ReplayCache)
    assert isinstance(HFTarget(qwen3_next([L, F])).make_cache(), ReplayCache)


@torch.no_grad()
def test_a_crop_only_rollback_is_wrong_where_the_hybrid_cache_is_exact():
    """The issue's case: prefill 6, verify 4, accept 1 (crop 3): transformers' DynamicCache.crop leaves the
    recurrent state with the 3 rejected tokens in; the HybridCache picks the state after token 7."""
    hf, ours = pair([L, L, L, F])
    ids = torch.randint(0, 32, (1, 11), generator=torch.Generator().manual_seed(0))
    plain = hf(ids[:, :8]).logits[:, -1]  # what comes after the 7 committed + next token
    cache = transformers.DynamicCache(config=hf.config)
    cache.activate_past_recording()
    hf(ids[:, :6], past_key_values=cache, use_cache=True)
    hf(ids[:, 6:10], past_key_values=cache, use_cache=True)
    cache.crop(-3)
    cropped = hf(ids[:, 7:8], past_key_values=cache, use_cache=True).logits[:, -1]
    assert (cropped - plain).abs().max() > 0.1  # measured ≈ 10 with these weights
    exact = ours.make_cache()
    ours(ids[:, :6], past_key_values=exact)
    ours(ids[:, 6:10], past_key_values=exact)
    exact.crop(7)
    assert_close(ours(ids[:, 7:8], past_key_values=exact).logits[:, -1], plain)
    via_hf = HFTarget(hf)  # transformers' model, snapshot + replay
    replayed = via_hf.make_cache()
    via_hf(ids[:, :6], past_key_values=replayed)
    via_hf(ids[:, 6:10], past_key_values=replayed)
    replayed.crop(7)
    assert replayed.get_seq_length() == 7
    assert_close(via_hf(ids[:, 7:8], past_key_values=replayed).logits[:, -1], plain)


# ---------------------------------------------------------------------------------------------
# Exact rollback: the property
# ---------------------------------------------------------------------------------------------

OURS = {tuple(mix): pair(mix, seed=7)[1] for mix in ([L, F, L], [L, L])}


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    mix=st.sampled_from(sorted(OURS)),
    prefill=st.integers(1, 7),
    steps=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), min_size=1, max_size=3),
    seed=st.integers(0, 99),
)
def test_crop_after_a_verify_equals_a_forward_of_the_committed_tokens(mix, prefill, steps, seed):
    """For random verifies of L tokens and acceptance m ∈ 0..L: after crop(n + m) every linear layer's
    (W, S) and every attention layer's K/V equal those of one plain forward of the committed tokens, and
    so does the next step's output."""
    target = OURS[mix]
    g = torch.Generator().manual_seed(seed)
    committed = torch.randint(0, 32, (1, prefill), generator=g)
    cache = target.make_cache()
    with torch.no_grad():
        target(committed, past_key_values=cache)
        for verify, keep in steps:
            block = torch.randint(0, 32, (1, verify), generator=g)
            target(block, past_key_values=cache)
            keep = min(keep, verify)
            cache.crop(committed.shape[1] + keep)
            committed = torch.cat([committed, block[:, :keep]], 1)
        plain = target.make_cache()
        target(committed, past_key_values=plain)
        for layer_idx in cache.linear:
            for ours_state, plain_state in zip(cache.linear_state(layer_idx), plain.linear_state(layer_idx)):
                assert_close(ours_state, plain_state)
        if cache.kv is not None:
            for k, plain_k in zip(cache.kv.keys + cache.kv.values, plain.kv.keys + plain.kv.values):
                assert_close(k, plain_k)
        assert cache.lengths() == plain.lengths() == [committed.shape[1]] * len(mix)
        nxt = torch.randint(0, 32, (1, 2), generator=g)
        assert_close(target(nxt, past_key_values=cache).logits, target(nxt, past_key_values=plain).logits)


def test_crops_the_states_cannot_answer_are_refused():
    target = OURS[(L, L)]
    cache = HybridCache([L, L], keep_positions=4)
    with torch.no_grad():
        target(torch.tensor([[1, 2, 3, 4, 5, 6]]), past_key_values=cache)  # 6 > keep_positions: last state only
        with pytest.raises(ValueError, match="kept only its final state"):
            cache.crop(3)
        cache.crop(6)
        target(torch.tensor([[7, 8, 9]]), past_key_values=cache)
        with pytest.raises(ValueError, match=r"only be rolled back within its last forward \(6 … 9\)"):
            cache.crop(5)
        cache.crop(7)
        assert cache.lengths() == [7, 7]


# ---------------------------------------------------------------------------------------------
# Lossless decoding on hybrid targets
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer_types, layer_ids", [([L, L, L, F], [0, 2]), ([F, L], [1]), ([L, L, F, F], [1, 2])])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_speculative_output_is_the_targets_own(layer_types, layer_ids, seed):
    """Random draft (τ ≈ 0) and an oracle forcing partial acceptance (crops inside every verify):
    both give generate()'s tokens, for several prompts."""
    _, target = pair(layer_types, seed)
    draft = random_draft(target, num_hidden_layers=2, block_size=4, seed=seed, target_layer_ids=layer_ids)
    for prompt in ([[1, 2, 3]], [[seed + 5]], [[9, 4, 30, 2, 2, 17, 8]]):
        ids = torch.tensor(prompt)
        ar = generate(target, ids, 20)
        assert torch.equal(spec_generate(draft, target, ids, 20).output_ids, ar.output_ids)
        forced = spec_generate(OracleDraft(draft, ar.output_ids[0], [1, 2, 0, 3, 1, 2]), target, ids, 20)
        assert torch.equal(forced.output_ids, ar.output_ids)
        assert forced.acceptance_lengths[:4] == [1, 2, 0, 3]


# SmolLM2-135M's widths (30 layers, hidden 576, 9 / 3 heads of 64, FFN 1536, vocabulary 49152, tied) as a
# hybrid: transformers' default layout (every 4th layer full: 23 Gated DeltaNet, 7 gated attention), Gated
# DeltaNet 3 key / 6 value heads of 64 (an assumption: SmolLM2 has none), partial RoPE 0.25
SMOLLM2_HYBRID = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    linear_num_key_heads=3,
    linear_num_value_heads=6,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)


@torch.no_grad()
def test_a_smollm2_sized_random_hybrid_decodes_greedily_as_ar():
    """Kept cheap for CI (measured 10 s on one thread of a busy 2-core machine): 12 new tokens after an
    8-token prompt; the random draft (τ ≈ 0: a crop inside every verify) and an oracle forcing τ = 1, 3, 0, 2
    both give generate()'s tokens."""
    from dflash_ref.drafts.random_draft import randomize_

    target = randomize_(Qwen3_5Target(HybridConfig(**SMOLLM2_HYBRID)), seed=3, std=0.05)
    draft = random_draft(target, num_hidden_layers=2, block_size=8, seed=3, target_layer_ids=[1, 27])
    ids = torch.randint(0, 49152, (1, 8), generator=torch.Generator().manual_seed(3))
    ar = generate(target, ids, 12)
    assert torch.equal(spec_generate(draft, target, ids, 12).output_ids, ar.output_ids)
    forced = spec_generate(OracleDraft(draft, ar.output_ids[0], [1, 3, 0, 2]), target, ids, 12)
    assert torch.equal(forced.output_ids, ar.output_ids) and forced.acceptance_lengths[:4] == [1, 3, 0, 2]


@pytest.mark.parametrize("through", ["own", "hf"])
def test_sampled_speculative_output_has_the_targets_distribution(through):
    """Exact enumeration (V = 3, 3 new tokens) against 1200 speculative samples, as test_lossless.py does
    for the Qwen3 target; the far random draft is accepted sometimes, so crops land inside verifies.
    Both the own target (per-position states) and transformers' model (snapshot + replay; half the samples:
    its forwards are slower, the chi-square test keeps ≥ 5 expected per cell)."""
    from test_lossless import N_SAMPLES, P_MIN, chi_square_pvalue, exact_distribution

    hf = hf_hybrid([L, F, L], seed=4, vocab_size=3, initializer_range=0.25)
    target = Qwen3_5Target.from_hf(hf) if through == "own" else HFTarget(hf)
    draft = random_draft(
        target, num_hidden_layers=1, block_size=4, seed=9, std=2.0, mask_token_id=2, target_layer_ids=[0, 2]
    )
    exact = exact_distribution(target, [1], 3, temperature=1.0)
    torch.manual_seed(1234)
    samples, accepted = [], 0
    for _ in range(N_SAMPLES if through == "own" else N_SAMPLES // 2):
        out = spec_generate(draft, target, torch.tensor([[1]]), 3, temperature=1.0)
        samples.append(tuple(out.output_ids[0, 1:].tolist()))
        accepted += sum(out.acceptance_lengths)
    assert chi_square_pvalue(samples, exact) > P_MIN
    assert accepted > 0


# ---------------------------------------------------------------------------------------------
# transformers' own hybrid through HFTarget: snapshot + replay
# ---------------------------------------------------------------------------------------------

HF_HYBRID = HFTarget(hf_hybrid([L, F, L], seed=7))


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefill=st.integers(1, 7),
    steps=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 6)), min_size=1, max_size=3),
    seed=st.integers(0, 99),
)
def test_replay_crop_equals_a_forward_of_the_committed_tokens(prefill, steps, seed):
    """ReplayCache after random verifies and crops: conv/recurrent states and K/V equal a plain forward's,
    to 1e-4 × scale: transformers runs one token by its recurrent algorithm and several by its chunked one,
    which differ by up to ~3e-5 × scale at these weights (test_whole_model_equals_transformers); a crop
    without replay misses by order one (test_a_crop_only_rollback_is_wrong…)."""
    target, g = HF_HYBRID, torch.Generator().manual_seed(seed)
    committed = torch.randint(0, 32, (1, prefill), generator=g)
    cache = target.make_cache()
    with torch.no_grad():
        target(committed, past_key_values=cache)
        for verify, keep in steps:
            block = torch.randint(0, 32, (1, verify), generator=g)
            target(block, past_key_values=cache)
            keep = min(keep, verify)
            cache.crop(committed.shape[1] + keep)
            committed = torch.cat([committed, block[:, :keep]], 1)
        plain = target.make_cache()
        target(committed, past_key_values=plain)
    assert cache.get_seq_length() == plain.get_seq_length() == committed.shape[1]
    for ours_layer, plain_layer in zip(cache.cache.layers, plain.cache.layers):
        if isinstance(ours_layer, transformers.cache_utils.LinearAttentionCacheLayerMixin):
            assert_close(ours_layer.conv_states[0], plain_layer.conv_states[0], atol=1e-4)
            assert_close(ours_layer.recurrent_states[0], plain_layer.recurrent_states[0], atol=1e-4)
        else:
            assert_close(ours_layer.keys, plain_layer.keys, atol=1e-4)
            assert_close(ours_layer.values, plain_layer.values, atol=1e-4)


@pytest.mark.parametrize("model", ["qwen3_5", "qwen3_next"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_speculative_output_through_hf_target_is_the_targets_own(seed, model):
    """transformers' Qwen3.5 and Qwen3-Next through HFTarget (snapshot + replay): random and oracle drafts."""
    target = HFTarget(hf_hybrid([L, L, L, F], seed) if model == "qwen3_5" else qwen3_next([L, L, L, F], seed))
    draft = random_draft(target, num_hidden_layers=2, block_size=4, seed=seed, target_layer_ids=[0, 2])
    for prompt in ([[1, 2, 3]], [[9, 4, 30, 2, 2, 17, 8]]):
        ids = torch.tensor(prompt)
        ar = generate(target, ids, 20)
        assert torch.equal(spec_generate(draft, target, ids, 20).output_ids, ar.output_ids)
        forced = spec_generate(OracleDraft(draft, ar.output_ids[0], [1, 2, 0, 3, 1, 2]), target, ids, 20)
        assert torch.equal(forced.output_ids, ar.output_ids)
        assert forced.acceptance_lengths[:4] == [1, 2, 0, 3]


@torch.no_grad()
def test_qwen3_next_crop_only_is_wrong_and_replay_is_exact():
    """The issue's case on Qwen3-Next: DynamicCache.crop misses the plain forward, the replay cache does not."""
    model = qwen3_next([L, L, L, F])
    ids = torch.randint(0, 32, (1, 11), generator=torch.Generator().manual_seed(0))
    plain = model(ids[:, :8]).logits[:, -1]
    cache = transformers.DynamicCache(config=model.config)
    cache.activate_past_recording()
    model(ids[:, :6], past_key_values=cache, use_cache=True)
    model(ids[:, 6:10], past_key_values=cache, use_cache=True)
    cache.crop(-3)
    assert (model(ids[:, 7:8], past_key_values=cache, use_cache=True).logits[:, -1] - plain).abs().max() > 0.05
    target = HFTarget(model)
    replayed = target.make_cache()
    target(ids[:, :6], past_key_values=replayed)
    target(ids[:, 6:10], past_key_values=replayed)
    replayed.crop(7)
    assert_close(target(ids[:, 7:8], past_key_values=replayed).logits[:, -1], plain, atol=1e-4)
