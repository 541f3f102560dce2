"""Parity with the official `dflash` 0.1.0 package (`dflash.model`), a peer implementation.

Stage by stage: layer sampling, context-feature extraction, the draft forward (fresh, with a KV
cache over several passes, on the SDPA and the explicit attention path, sliding-window layers,
is_causal overrides), and the whole decoding loop (greedy, sampled with the rejection verifier,
top-k / top-p, stop tokens, forced-correct drafts). Weights move between the two implementations
with one `load_state_dict` (conftest.official_twins); nothing of the official code is copied here.
"""

from __future__ import annotations

import functools
import random

import pytest
import torch
from conftest import (
    assert_close,
    draft_config,
    make_pair,
    official_twins,
    randomize_,
    target_config,
    use_explicit_attention,
)

from dflash_ref import (
    DFlashDraftModel,
    Qwen3Target,
    build_target_layer_ids,
    extract_context_feature,
    generate,
    spec_generate,
)
from dflash_ref.drafts.oracle import OracleDraft

official = pytest.importorskip("dflash.model")
transformers = pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("one_thread_module")

SEEDS = list(range(24))


# --------------------------------------------------------------------------- layer sampling


def test_build_target_layer_ids_matches_official_everywhere():
    compared = 0
    for num_target_layers in range(1, 129):
        for num_draft_layers in range(1, 13):
            theirs = official.build_target_layer_ids(num_target_layers, num_draft_layers)
            ours = build_target_layer_ids(num_target_layers, num_draft_layers)
            assert ours == theirs, (num_target_layers, num_draft_layers, ours, theirs)
            assert all(type(i) is int for i in ours)
            compared += 1
    assert compared == 128 * 12


def test_build_target_layer_ids_qwen3_8b():
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert official.build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]


@pytest.mark.parametrize("bad", [(0, 3), (36, 0), (-1, 2)])
def test_build_target_layer_ids_refuses_invalid(bad):
    with pytest.raises(ValueError):
        build_target_layer_ids(*bad)


@pytest.mark.parametrize("seed", range(6))
def test_extract_context_feature_matches_official(seed):
    g = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    num_layers, batch, length, d = rng.randint(1, 8), rng.randint(1, 3), rng.randint(1, 7), rng.choice([4, 16])
    hidden_states = tuple(torch.randn(batch, length, d, generator=g) for _ in range(num_layers + 1))
    layer_ids = [rng.randrange(num_layers) for _ in range(rng.randint(1, 5))]  # repeats allowed
    ours = extract_context_feature(hidden_states, layer_ids)
    theirs = official.extract_context_feature(list(hidden_states), layer_ids)
    assert ours.shape == (batch, length, len(layer_ids) * d)
    assert torch.equal(ours, theirs)
    # the +1 offset: the first chunk is layer id's output, never the embedding output
    assert torch.equal(ours[..., :d], hidden_states[layer_ids[0] + 1])


# --------------------------------------------------------------------------- draft forward


def random_draft_case(seed: int):
    """A tiny random draft (with its official twin) and random inputs, varied by seed."""
    rng = random.Random(seed)
    ratio = (1, 2, 4)[seed % 3]  # GQA ratios H_q / H_kv
    kv_heads = rng.choice([1, 2])
    head_dim = rng.choice([4, 8, 16])
    hidden = rng.choice([16, 32, 48, 64])
    num_target_layers = rng.randint(2, 6)
    layer_ids = [rng.randrange(num_target_layers) for _ in range(rng.randint(1, 3))]
    tc = target_config(
        hidden_size=hidden,
        vocab_size=rng.randint(8, 16),
        num_hidden_layers=num_target_layers,
        rope_theta=rng.choice([10000.0, 1e6]),
    )
    dc = draft_config(
        tc,
        hidden_size=hidden,
        num_hidden_layers=1 + seed % 3,
        num_attention_heads=kv_heads * ratio,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=rng.choice([32, 64]),
        target_layer_ids=layer_ids,
        block_size=rng.randint(2, 8),
    )
    target = randomize_(Qwen3Target(tc), seed)
    draft = randomize_(DFlashDraftModel(dc), seed + 10_000)
    batch = 1 + (seed // 3) % 2
    ctx_len = rng.randint(1, 10)
    g = torch.Generator().manual_seed(seed)
    target_hidden = torch.randn(batch, ctx_len, len(layer_ids) * hidden, generator=g)
    noise_embedding = torch.randn(batch, dc.block_size, hidden, generator=g)
    offsets = torch.tensor([rng.randint(0, 20) for _ in range(batch)])[:, None]
    position_ids = offsets + torch.arange(ctx_len + dc.block_size)[None]  # (B, L_c + L_q)
    return target, draft, dict(position_ids=position_ids, noise_embedding=noise_embedding, target_hidden=target_hidden)


@pytest.mark.parametrize("seed", SEEDS)
def test_draft_forward_matches_official(seed):
    target, draft, inputs = random_draft_case(seed)
    _, off_draft = official_twins(target, draft)
    assert off_draft.target_layer_ids == draft.target_layer_ids
    with torch.no_grad():
        ours = draft(**inputs)
        theirs = off_draft(**inputs)
        assert ours.shape == inputs["noise_embedding"].shape
        assert_close(ours, theirs)
        # the explicit math path agrees with the official (SDPA) draft too
        assert use_explicit_attention(draft) == draft.config.num_hidden_layers
        assert_close(draft(**inputs), theirs)


def test_draft_forward_configs_cover_the_grid():
    """The parametrized configs above really vary what the brief asks for."""
    seen = dict(ratio=set(), layers=set(), batch=set(), block=set(), ctx=set(), head_dim=set())
    for seed in SEEDS:
        _, draft, inputs = random_draft_case(seed)
        c = draft.config
        seen["ratio"].add(c.num_attention_heads // c.num_key_value_heads)
        seen["layers"].add(c.num_hidden_layers)
        seen["batch"].add(inputs["noise_embedding"].shape[0])
        seen["block"].add(c.block_size)
        seen["ctx"].add(inputs["target_hidden"].shape[1])
        seen["head_dim"].add(c.head_dim)
    assert seen["ratio"] == {1, 2, 4} and seen["layers"] == {1, 2, 3} and seen["batch"] == {1, 2}
    assert len(seen["block"]) >= 4 and len(seen["ctx"]) >= 5 and len(seen["head_dim"]) >= 2


@pytest.mark.parametrize("is_causal", [None, True, False])
@pytest.mark.parametrize("explicit", [False, True])
def test_sliding_window_draft_matches_official(is_causal, explicit):
    target, draft = make_pair(
        3,
        draft_overrides=dict(
            layer_types=["sliding_attention", "full_attention"], sliding_window=3, is_causal=is_causal, block_size=6
        ),
    )
    off_draft = official_twins(target, draft)[1]
    attn = [layer.self_attn for layer in off_draft.layers]
    assert attn[0].sliding_window == 3 and attn[1].sliding_window is None
    assert [a.is_causal for a in attn] == [layer.self_attn.is_causal for layer in draft.layers]
    if explicit:
        use_explicit_attention(draft)
    g = torch.Generator().manual_seed(5)
    for batch, ctx_len in [(1, 1), (2, 7)]:
        inputs = dict(
            position_ids=torch.arange(ctx_len + 6)[None].expand(batch, -1),
            noise_embedding=torch.randn(batch, 6, 32, generator=g),
            target_hidden=torch.randn(batch, ctx_len, 64, generator=g),
        )
        with torch.no_grad():
            assert_close(draft(**inputs), off_draft(**inputs))


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize("explicit", [False, True])
def test_is_causal_override_matches_official(is_causal, explicit):
    target, draft, inputs = random_draft_case(7)
    cfg = draft.config
    draft = randomize_(
        DFlashDraftModel(
            draft_config(
                target.config,
                **{
                    **{
                        k: getattr(cfg, k)
                        for k in (
                            "hidden_size",
                            "num_hidden_layers",
                            "num_attention_heads",
                            "num_key_value_heads",
                            "head_dim",
                            "intermediate_size",
                            "target_layer_ids",
                            "block_size",
                        )
                    },
                    "is_causal": is_causal,
                },
            )
        ),
        7,
    )
    _, off_draft = official_twins(target, draft)
    assert all(layer.self_attn.is_causal is is_causal for layer in off_draft.layers)
    assert all(layer.self_attn.is_causal is is_causal for layer in draft.layers)
    if explicit:
        use_explicit_attention(draft)
    with torch.no_grad():
        ours, theirs = draft(**inputs), off_draft(**inputs)
        assert_close(ours, theirs)
        # the override really changes the output (the default for full layers is non-causal)
        if is_causal:
            plain = DFlashDraftModel(
                draft_config(
                    target.config,
                    **{
                        k: getattr(draft.config, k)
                        for k in (
                            "hidden_size",
                            "num_hidden_layers",
                            "num_attention_heads",
                            "num_key_value_heads",
                            "head_dim",
                            "intermediate_size",
                            "target_layer_ids",
                            "block_size",
                        )
                    },
                )
            )
            plain.load_state_dict(draft.state_dict())
            assert (plain.eval()(**inputs) - ours).abs().max() > 1e-3


def official_cache(config):
    cache = transformers.DynamicCache(config=config)
    cache.activate_past_recording()  # sliding layers must stay croppable
    return cache


def crop_official(cache, length: int) -> None:
    cache.crop(length - cache.get_seq_length())  # transformers 5: a negative count is removed


MULTI_PASS = [
    # (seed, context lengths per pass, block size, draft overrides)
    (0, [5, 2, 3], 4, {}),
    (1, [1, 1, 4], 2, {"num_hidden_layers": 3}),
    (2, [7, 3], 8, {"num_attention_heads": 8, "num_key_value_heads": 2}),
    (3, [4, 1, 6], 5, {"num_key_value_heads": 4}),
    (4, [3, 4, 2], 4, {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 3}),
    (
        5,
        [6, 2, 5],
        3,
        {"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 4, "is_causal": False},
    ),
]


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("seed,ctx_lens,block,overrides", MULTI_PASS)
def test_draft_multi_pass_kv_cache_matches_official(seed, ctx_lens, block, overrides, explicit):
    """Our KVCache vs transformers' DynamicCache over successive draft passes with new context,
    the cache cropped back to the context length after each pass, as in the decoding loop."""
    target, draft = make_pair(seed, draft_overrides=dict(block_size=block, **overrides))
    off_draft = official_twins(target, draft)[1]
    if explicit:
        use_explicit_attention(draft)
    ours_cache, their_cache = draft.make_cache(), official_cache(off_draft.config)
    g = torch.Generator().manual_seed(seed)
    k_d = len(draft.target_layer_ids) * draft.config.hidden_size
    start = 0
    with torch.no_grad():
        for ctx_len in ctx_lens:
            start += ctx_len  # the new context ends where the block starts
            inputs = dict(
                position_ids=torch.arange(start - ctx_len, start + block)[None],
                noise_embedding=torch.randn(1, block, 32, generator=g),
                target_hidden=torch.randn(1, ctx_len, k_d, generator=g),
            )
            ours = draft(**inputs, past_key_values=ours_cache, use_cache=True)
            theirs = off_draft(**inputs, past_key_values=their_cache, use_cache=True)
            assert_close(ours, theirs)
            assert ours_cache.get_seq_length() == start + block
            ours_cache.crop(start)
            crop_official(their_cache, start)
            assert ours_cache.get_seq_length() == their_cache.get_seq_length() == start
        # the cache matters: without the earlier context the last pass differs
        fresh = draft(**inputs)
        assert (fresh - ours).abs().max() > 1e-4


# --------------------------------------------------------------------------- the decoding loop


@functools.cache
def loop_case(seed: int):
    """A tiny pair with a small vocabulary (random drafts are sometimes right), its official twins,
    a prompt, a max_new_tokens that is not a multiple of the block, and stop tokens on some seeds."""
    rng = random.Random(seed)
    vocab = 8 + seed % 9  # 8..16
    block = 2 + seed % 7  # 2..8
    target, draft = make_pair(
        seed,
        target_overrides=dict(vocab_size=vocab, num_hidden_layers=rng.randint(3, 5)),
        draft_overrides=dict(block_size=block, num_hidden_layers=rng.randint(1, 2)),
    )
    hf_target, off_draft = official_twins(target, draft)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, rng.randint(1, 6)), generator=g)
    max_new = block * rng.randint(2, 4) + rng.randint(1, block - 1) if block > 2 else 2 * rng.randint(2, 5) + 1
    assert max_new % block
    stop = None
    if seed % 3 == 0:  # a stop token the greedy run meets a few tokens in
        ar = generate(target, prompt, max_new).output_ids[0, prompt.shape[1] :]
        stop = [int(ar[min(2 + seed % 5, len(ar) - 1)])]
    return target, draft, hf_target, off_draft, prompt, max_new, stop


SAMPLING = {
    "greedy": dict(temperature=0.0),
    "t1": dict(temperature=1.0),
    "t07_topk": dict(temperature=0.7, top_k=4),
    "t13_topp": dict(temperature=1.3, top_p=0.8),
    "topk_topp": dict(temperature=0.9, top_k=5, top_p=0.9),
}


@functools.cache
def run_both(seed: int, mode: str, block_size: int | None = None):
    target, draft, hf_target, off_draft, prompt, max_new, stop = loop_case(seed)
    kw = dict(SAMPLING[mode], block_size=block_size)
    torch.manual_seed(seed)
    ours = spec_generate(draft, target, prompt, max_new, stop, **kw)
    torch.manual_seed(seed)
    theirs = official.dflash_generate(off_draft, hf_target, prompt, max_new, stop, return_stats=True, **kw)
    return ours, theirs


@pytest.mark.parametrize("mode", list(SAMPLING))
@pytest.mark.parametrize("seed", SEEDS)
def test_spec_generate_matches_official(seed, mode):
    ours, theirs = run_both(seed, mode)
    assert torch.equal(ours.output_ids, theirs.output_ids), (ours.output_ids, theirs.output_ids)
    assert ours.tokens_per_step == theirs.acceptance_lengths
    assert ours.num_output_tokens == theirs.num_output_tokens
    # bookkeeping: committed tokens add up, and τ + 1 ≥ committed (clipped by length or a stop)
    assert 1 + sum(ours.tokens_per_step) == ours.num_output_tokens
    assert all(1 <= p <= t + 1 for p, t in zip(ours.tokens_per_step, ours.acceptance_lengths))


@pytest.mark.parametrize("block_size", [1, 3])
@pytest.mark.parametrize("mode", ["greedy", "t1"])
@pytest.mark.parametrize("seed", [1, 6, 11])
def test_spec_generate_block_size_override_matches_official(seed, mode, block_size):
    ours, theirs = run_both(seed, mode, block_size)
    assert torch.equal(ours.output_ids, theirs.output_ids)
    assert ours.tokens_per_step == theirs.acceptance_lengths
    if block_size == 1:
        assert set(ours.tokens_per_step) <= {1} and ours.num_draft_passes == 0


def test_loop_cases_exercise_acceptance_and_stops():
    """Across the seeds the comparison above is not vacuous: drafts are sometimes accepted (greedy
    and sampled), stop tokens end some runs early, and some runs hit max_new_tokens."""
    accepted = {mode: 0 for mode in SAMPLING}
    stopped_early = reached_max = 0
    for seed in SEEDS:
        _, _, _, _, prompt, max_new, stop = loop_case(seed)
        for mode in SAMPLING:
            ours, theirs = run_both(seed, mode)
            accepted[mode] += sum(t > 0 for t in ours.acceptance_lengths)
            assert sum(p > 1 for p in theirs.acceptance_lengths) <= sum(t > 0 for t in ours.acceptance_lengths)
            if mode == "greedy":
                if ours.num_output_tokens < max_new:
                    assert stop is not None and int(ours.output_ids[0, -1]) in stop
                    stopped_early += 1
                else:
                    reached_max += 1
    assert all(n > 0 for n in accepted.values()), accepted
    assert stopped_early >= 3 and reached_max >= 3


def test_greedy_loop_is_lossless_against_official_ar():
    """Both loops reproduce the target's own greedy decoding (ours and transformers')."""
    for seed in SEEDS[:8]:
        target, _, hf_target, _, prompt, max_new, stop = loop_case(seed)
        ours, theirs = run_both(seed, "greedy")
        ar = generate(target, prompt, max_new, stop).output_ids
        assert torch.equal(ours.output_ids, ar)
        hf = hf_target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=stop,
            pad_token_id=0,
        )
        assert torch.equal(theirs.output_ids, hf[:, : theirs.output_ids.shape[1]])


# --------------------------------------------------------------------------- forced-correct drafts


def force_official_proposals(off_draft, continuation: list[int], accept: int | None = None) -> list[int]:
    """Patch an official draft instance so its proposals are continuation[position] for the block
    positions it just saw (the same rule as OracleDraft, written independently): its network still
    runs, only compute_logits is replaced. Returns a list that records the positions drafted."""
    seen: list[int] = []
    inner_forward = off_draft.forward

    def forward(*args, **kwargs):
        q_len = kwargs["noise_embedding"].shape[1]
        seen[:] = kwargs["position_ids"][0, -q_len:].tolist()
        return inner_forward(*args, **kwargs)

    def compute_logits(hidden, output_head):
        logits = output_head(hidden)  # (1, γ, V)
        vocab = logits.shape[-1]
        forced = torch.full_like(logits, -1e4)
        for i, pos in enumerate(seen[1:]):
            token = continuation[pos] if pos < len(continuation) else 0
            if accept is not None and i >= accept:
                token = (token + 1) % vocab
            forced[0, i, token] = 1e4
        return forced

    off_draft.forward = forward
    off_draft.compute_logits = compute_logits
    return seen


@pytest.mark.parametrize("accept", [None, 0, 1])
@pytest.mark.parametrize("seed", [0, 2, 4, 5, 8, 13])
def test_oracle_draft_matches_official_with_forced_proposals(seed, accept):
    target, draft, hf_target, off_draft, prompt, max_new, _ = loop_case(seed)
    _, off_draft = official_twins(target, draft)  # a fresh instance: it is patched below
    block = draft.block_size
    ar = generate(target, prompt, max_new).output_ids  # the target's greedy output
    oracle = OracleDraft(draft, continuation=ar[0], accept=accept)
    seen = force_official_proposals(off_draft, ar[0].tolist(), accept)
    ours = spec_generate(oracle, target, prompt, max_new)
    theirs = official.dflash_generate(off_draft, hf_target, prompt, max_new, None, return_stats=True)
    assert seen, "the official draft was never called"
    assert torch.equal(ours.output_ids, theirs.output_ids)
    assert ours.tokens_per_step == theirs.acceptance_lengths
    assert torch.equal(ours.output_ids, ar)  # lossless
    expected = block - 1 if accept is None else min(accept, block - 1)
    # every full step accepts exactly `expected`; only the last (clipped) step may accept fewer
    assert all(t == expected for t in ours.acceptance_lengths[:-1]), ours.acceptance_lengths
    assert ours.acceptance_lengths[-1] <= expected
    assert all(p == expected + 1 for p in theirs.acceptance_lengths[:-1])
    steps = len(ours.acceptance_lengths)
    assert steps == -(-(max_new - 1) // (expected + 1))  # ⌈(max_new − 1) / (τ + 1)⌉
