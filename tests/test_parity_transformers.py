"""Parity with transformers: our explicit Qwen3 target against `Qwen3ForCausalLM` (logits and every
hidden state, with and without a KV cache, after crops), checkpoints written by transformers or by
us and read by the other side (sharded bf16 targets, drafts in the official format), and the
SDPA attention path against the explicit one.
"""

from __future__ import annotations

import json
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

from dflash_ref import DFlashDraftModel, Qwen3Target, load_draft, load_target, save_draft
from dflash_ref.dflash2 import make_draft

transformers = pytest.importorskip("transformers")
official = pytest.importorskip("dflash.model")

ATOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread_module")


def assert_outputs_close(ours, theirs, num_layers: int, atol: float = ATOL) -> None:
    """Logits and all L + 1 hidden states (embedding output first, final-normed last)."""
    assert_close(ours.logits, theirs.logits, atol)
    assert len(ours.hidden_states) == len(theirs.hidden_states) == num_layers + 1
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
        try:
            assert_close(a, b, atol)
        except AssertionError as e:
            raise AssertionError(f"hidden_states[{i}]: {e}") from None


def hf_cache(hf_model):
    return transformers.DynamicCache(config=hf_model.config)


def crop_hf(cache, length: int) -> None:
    cache.crop(length - cache.get_seq_length())  # transformers 5: a negative count is removed


# (seed, tie_word_embeddings, num_attention_heads, num_key_value_heads, num_hidden_layers)
TARGETS = [
    (0, False, 4, 2, 4),  # GQA 2
    (1, True, 4, 2, 3),  # tied, GQA 2
    (2, False, 4, 4, 2),  # MHA
    (3, True, 4, 4, 4),  # tied, MHA
    (4, False, 8, 2, 3),  # GQA 4
    (5, True, 4, 1, 2),  # tied, MQA
]


def make_target(seed, tie, heads, kv_heads, layers, **extra) -> Qwen3Target:
    hidden = 16 * (1 + seed % 3)
    tc = target_config(
        tie_word_embeddings=tie,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        num_hidden_layers=layers,
        hidden_size=hidden,
        head_dim=8,
        vocab_size=11 + seed,
        rope_theta=(10000.0, 1e6)[seed % 2],
        **extra,
    )
    return randomize_(Qwen3Target(tc), seed)


def hf_twin(target: Qwen3Target):
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**target.config.to_dict())).eval()
    hf.load_state_dict(target.state_dict())
    return hf


# --------------------------------------------------------------------------- target forward


@pytest.mark.parametrize("seed,tie,heads,kv_heads,layers", TARGETS)
def test_target_forward_matches_transformers(seed, tie, heads, kv_heads, layers):
    target = make_target(seed, tie, heads, kv_heads, layers)
    hf = hf_twin(target)
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == tie
    assert (target.lm_head.weight is target.model.embed_tokens.weight) == tie
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, target.config.vocab_size, (2, 9), generator=g)
    with torch.no_grad():
        ours = target(ids, output_hidden_states=True)
        theirs = hf(ids, output_hidden_states=True)
        assert_outputs_close(ours, theirs, layers)
        # the last entry is after the final norm (transformers' convention), the first the embedding
        assert_close(ours.hidden_states[0], target.model.embed_tokens(ids))
        assert_close(ours.logits, target.lm_head(ours.hidden_states[-1]))
        # explicit position ids (an offset start) and logits_to_keep
        pos = torch.arange(5, 14)[None].expand(2, -1)
        assert_close(target(ids, pos).logits, hf(ids, position_ids=pos).logits)
        assert_close(target(ids, logits_to_keep=1).logits, hf(ids, logits_to_keep=1).logits)


@pytest.mark.parametrize("explicit", [False, True])
@pytest.mark.parametrize("seed,tie,heads,kv_heads,layers", TARGETS)
def test_target_with_cache_and_crop_matches_transformers(seed, tie, heads, kv_heads, layers, explicit):
    """Prefill, token-by-token, block-wise continuation, then crop both caches and continue."""
    target = make_target(seed, tie, heads, kv_heads, layers)
    hf = hf_twin(target)
    if explicit:
        assert use_explicit_attention(target) == layers
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(100 + seed)
    batch = 1 + seed % 2
    ours_cache, their_cache = target.make_cache(), hf_cache(hf)
    full = torch.randint(0, vocab, (batch, 5), generator=g)  # every token fed so far, for a no-cache check

    def step(ids):
        nonlocal full
        with torch.no_grad():
            ours = target(ids, past_key_values=ours_cache, output_hidden_states=True)
            theirs = hf(ids, past_key_values=their_cache, use_cache=True, output_hidden_states=True)
        assert_outputs_close(ours, theirs, layers)
        assert ours_cache.get_seq_length() == their_cache.get_seq_length()
        return ours

    step(full)  # prefill 5
    for _ in range(3):  # token by token
        new = torch.randint(0, vocab, (batch, 1), generator=g)
        step(new)
        full = torch.cat([full, new], dim=1)
    new = torch.randint(0, vocab, (batch, 4), generator=g)  # a block
    last = step(new)
    full = torch.cat([full, new], dim=1)
    assert ours_cache.get_seq_length() == 12
    with torch.no_grad():  # the cache is exact, not approximate
        assert_close(last.logits, target(full).logits[:, -4:])

    for keep, block in [(9, 3), (10, 1), (6, 5)]:  # crop (rejected tokens go), continue
        ours_cache.crop(keep)
        crop_hf(their_cache, keep)
        assert ours_cache.get_seq_length() == their_cache.get_seq_length() == keep
        full = full[:, :keep]
        new = torch.randint(0, vocab, (batch, block), generator=g)
        last = step(new)
        full = torch.cat([full, new], dim=1)
        with torch.no_grad():
            assert_close(last.logits, target(full).logits[:, -block:])


# --------------------------------------------------------------------------- target checkpoints


@pytest.mark.parametrize("tie", [False, True])
def test_sharded_bf16_target_checkpoint_loads(tmp_path, tie):
    target = make_target(6, tie, 4, 2, 3)
    hf = hf_twin(target).to(torch.bfloat16)
    hf.save_pretrained(tmp_path, max_shard_size="20KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) > 1 and all((tmp_path / s).is_file() for s in shards)
    assert not (tmp_path / "model.safetensors").exists()

    ours = load_target(tmp_path)  # the config's dtype: bf16
    assert ours.dtype == torch.bfloat16 and ours.config.tie_word_embeddings == tie
    assert (ours.lm_head.weight is ours.model.embed_tokens.weight) == tie
    theirs = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    ours_sd, their_sd = ours.state_dict(), theirs.state_dict()
    assert set(ours_sd) == set(their_sd)
    assert all(torch.equal(ours_sd[k], their_sd[k]) for k in ours_sd)
    ids = torch.randint(0, target.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a, b = ours(ids).logits, theirs(ids).logits
        assert a.dtype == b.dtype == torch.bfloat16
        scale = b.float().abs().max().item()
        assert_close(a, b, atol=0.03 * scale)  # bf16: ~3 significant digits
        # the same bf16 numbers read into fp32 on both sides agree to fp32 precision
        ours32 = load_target(tmp_path, dtype=torch.float32)
        theirs32 = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
        assert ours32.dtype == theirs32.dtype == torch.float32
        assert_outputs_close(ours32(ids), theirs32(ids, output_hidden_states=True), 3)
        # and they are the bf16-rounded weights, not the original fp32 ones
        assert_close(ours32.model.embed_tokens.weight, target.model.embed_tokens.weight.bfloat16().float(), 0)


# --------------------------------------------------------------------------- draft checkpoints


def draft_inputs(draft, batch=2, ctx_len=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    d, q = draft.config.hidden_size, draft.block_size
    return dict(
        position_ids=torch.arange(3, 3 + ctx_len + q)[None].expand(batch, -1),
        noise_embedding=torch.randn(batch, q, d, generator=g),
        target_hidden=torch.randn(batch, ctx_len, len(draft.target_layer_ids) * d, generator=g),
    )


DRAFTS = [
    (0, {}),
    (1, dict(num_hidden_layers=3, target_layer_ids=[0, 2, 3], block_size=8)),
    (2, dict(num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, is_causal=True)),
]


@pytest.mark.parametrize("seed,overrides", DRAFTS)
def test_saved_draft_loads_in_official(tmp_path, seed, overrides):
    target, draft = make_pair(seed, draft_overrides=overrides)
    save_draft(draft, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    assert config["dflash_config"] == {"mask_token_id": draft.mask_token_id, "target_layer_ids": draft.target_layer_ids}
    theirs = official.DFlashDraftModel.from_pretrained(tmp_path).eval()
    assert theirs.block_size == draft.block_size and theirs.mask_token_id == draft.mask_token_id
    assert theirs.target_layer_ids == draft.target_layer_ids
    assert [layer.self_attn.is_causal for layer in theirs.layers] == [
        layer.self_attn.is_causal for layer in draft.layers
    ]
    their_sd = theirs.state_dict()
    assert set(their_sd) == set(draft.state_dict())
    assert all(torch.equal(v, their_sd[k]) for k, v in draft.state_dict().items())
    inputs = draft_inputs(draft, seed=seed)
    with torch.no_grad():
        assert_close(draft(**inputs), theirs(**inputs))
    # round trip through our own loader too
    again = load_draft(tmp_path)
    with torch.no_grad():
        assert_close(again(**inputs), draft(**inputs), 0)


def test_saved_bf16_draft_loads_in_official(tmp_path):
    _, draft = make_pair(4)
    save_draft(draft, tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    ours = load_draft(tmp_path)
    assert next(ours.parameters()).dtype == torch.bfloat16
    theirs = official.DFlashDraftModel.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ours32 = load_draft(tmp_path, dtype=torch.float32)
    inputs = draft_inputs(draft, seed=4)
    with torch.no_grad():
        assert_close(ours32(**inputs), theirs(**inputs))
        bf16_out = ours(**{k: v.bfloat16() if v.is_floating_point() else v for k, v in inputs.items()})
        assert bf16_out.dtype == torch.bfloat16
        assert_close(bf16_out, ours32(**inputs), atol=0.1 * ours32(**inputs).abs().max().item())


@pytest.mark.parametrize("seed,overrides", DRAFTS)
def test_official_saved_draft_loads_here(tmp_path, seed, overrides):
    target, draft = make_pair(seed, draft_overrides=overrides)
    _, off_draft = official_twins(target, draft)
    off_draft.save_pretrained(tmp_path)
    ours = load_draft(tmp_path)
    for key in (
        "block_size",
        "mask_token_id",
        "target_layer_ids",
        "num_hidden_layers",
        "num_target_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rope_theta",
        "is_causal",
    ):
        assert getattr(ours.config, key) == getattr(draft.config, key), key
    off_sd = off_draft.state_dict()
    assert set(ours.state_dict()) == set(off_sd)
    assert all(torch.equal(v, off_sd[k]) for k, v in ours.state_dict().items())
    inputs = draft_inputs(draft, seed=seed)
    with torch.no_grad():
        assert_close(ours(**inputs), off_draft(**inputs))


SLIDING = dict(layer_types=["sliding_attention", "full_attention"], sliding_window=3)


def test_saved_sliding_draft_keeps_its_window_in_official(tmp_path):
    _, draft = make_pair(7, draft_overrides=SLIDING)
    save_draft(draft, tmp_path)
    theirs = official.DFlashDraftModel.from_pretrained(tmp_path).eval()
    inputs = draft_inputs(draft, ctx_len=7, seed=7)
    with torch.no_grad():
        assert_close(draft(**inputs), theirs(**inputs))
    assert theirs.layers[0].self_attn.sliding_window == 3


def test_official_saved_sliding_draft_loads_here(tmp_path):
    """With use_sliding_window=true (transformers keeps the window) the folder round-trips."""
    target, draft = make_pair(8, draft_overrides=SLIDING)
    d = draft.config.to_dict()
    d["use_sliding_window"] = True
    off_draft = official.DFlashDraftModel(transformers.Qwen3Config(**d)).eval()
    off_draft.load_state_dict(draft.state_dict())
    off_draft.save_pretrained(tmp_path)
    ours = load_draft(tmp_path)
    assert ours.config.sliding_window == 3 and ours.layers[0].self_attn.sliding_window == 3
    inputs = draft_inputs(draft, ctx_len=7, seed=8)
    with torch.no_grad():
        assert_close(ours(**inputs), off_draft(**inputs))


def test_official_sliding_layers_without_window_load_here(tmp_path):
    _, draft = make_pair(9, draft_overrides=SLIDING)
    d = draft.config.to_dict()
    d["use_sliding_window"] = False  # transformers then drops the window
    off_draft = official.DFlashDraftModel(transformers.Qwen3Config(**d)).eval()
    off_draft.load_state_dict(draft.state_dict())
    assert off_draft.layers[0].self_attn.sliding_window is None and off_draft.layers[0].self_attn.is_causal
    off_draft.save_pretrained(tmp_path)
    ours = load_draft(tmp_path)
    assert ours.config.sliding_window is None and ours.layers[0].self_attn.is_causal
    inputs = draft_inputs(draft, ctx_len=7, seed=9)
    with torch.no_grad():
        assert_close(ours(**inputs), off_draft(**inputs))


# --------------------------------------------------------------------------- SDPA vs explicit


def random_draft(seed: int, **overrides) -> DFlashDraftModel:
    rng = random.Random(seed)
    kv = rng.choice([1, 2])
    layers = len(overrides["layer_types"]) if "layer_types" in overrides else rng.randint(1, 3)
    dc = draft_config(
        target_config(),
        num_hidden_layers=layers,
        num_key_value_heads=kv,
        num_attention_heads=kv * rng.choice([1, 2, 4]),
        head_dim=rng.choice([4, 8]),
        block_size=rng.randint(2, 8),
        **overrides,
    )
    return randomize_(make_draft(dc), seed)


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(is_causal=True), SLIDING, dict(SLIDING, is_causal=False, sliding_window=2)],
    ids=["plain", "causal", "sliding", "sliding-noncausal"],
)
@pytest.mark.parametrize("seed", range(4))
def test_draft_sdpa_matches_explicit(seed, overrides):
    sdpa = random_draft(seed, **overrides)
    explicit = random_draft(seed, **overrides)
    assert use_explicit_attention(explicit) == explicit.config.num_hidden_layers
    g = torch.Generator().manual_seed(seed)
    caches = sdpa.make_cache(), explicit.make_cache()
    k_d = len(sdpa.target_layer_ids) * sdpa.config.hidden_size
    q, start = sdpa.block_size, 0
    with torch.no_grad():
        for ctx_len in (1 + seed, 3):  # two passes through a cache
            start += ctx_len
            inputs = dict(
                position_ids=torch.arange(start - ctx_len, start + q)[None],
                noise_embedding=torch.randn(1, q, 32, generator=g),
                target_hidden=torch.randn(1, ctx_len, k_d, generator=g),
            )
            a = sdpa(**inputs, past_key_values=caches[0], use_cache=True)
            b = explicit(**inputs, past_key_values=caches[1], use_cache=True)
            assert_close(a, b)
            for c in caches:
                c.crop(start)
        batched = draft_inputs(sdpa, batch=2, ctx_len=5, seed=seed)
        assert_close(sdpa(**batched), explicit(**batched))


@pytest.mark.parametrize("seed,tie,heads,kv_heads,layers", TARGETS[:4])
def test_target_sdpa_matches_explicit(seed, tie, heads, kv_heads, layers):
    sdpa = make_target(seed, tie, heads, kv_heads, layers)
    explicit = make_target(seed, tie, heads, kv_heads, layers)
    assert use_explicit_attention(explicit) == layers
    ids = torch.randint(0, sdpa.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert_outputs_close(sdpa(ids), explicit(ids), layers)
        caches = sdpa.make_cache(), explicit.make_cache()
        for chunk in (ids[:, :6], ids[:, 6:7], ids[:, 7:]):  # prefill, one token, a block
            assert_outputs_close(
                sdpa(chunk, past_key_values=caches[0]), explicit(chunk, past_key_values=caches[1]), layers
            )
        for c in caches:
            c.crop(4)
        assert_outputs_close(
            sdpa(ids[:, 4:8], past_key_values=caches[0]), explicit(ids[:, 4:8], past_key_values=caches[1]), layers
        )
