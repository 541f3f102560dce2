"""Grouped-query attention without repeated key/value heads (loading/grouped_attention.py): eager's numbers,
eager's greedy tokens in batched, left-padded generation, and a clear refusal of what it does not do."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.loading.grouped_attention import (
    GROUPED,
    SDPA_GROUPED,
    UnsupportedAttention,
    grouped_attention,
    register,
    sdpa_grouped_attention,
    use_sdpa_grouped,
)

transformers = pytest.importorskip("transformers")
from transformers.integrations.sdpa_attention import sdpa_attention_forward  # noqa: E402
from transformers.models.llama.modeling_llama import eager_attention_forward  # noqa: E402


class Module(torch.nn.Module):
    def __init__(self, groups_per_head: int):
        super().__init__()
        self.num_key_value_groups = groups_per_head


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    groups=st.integers(1, 3),
    per_group=st.integers(1, 4),
    n=st.integers(1, 5),
    past=st.integers(0, 6),
    mask=st.sampled_from(["none", "float", "bool"]),
    seed=st.integers(0, 2**16),
)
def test_grouped_attention_gives_eagers_outputs_and_weights(batch, groups, per_group, n, past, mask, seed):
    g = torch.Generator().manual_seed(seed)
    heads, length, d = groups * per_group, past + n, 8
    query = torch.randn(batch, n, heads, d, generator=g).transpose(1, 2)  # (B, H, n, d) as models pass it
    key, value = torch.randn(2, batch, groups, length, d, generator=g)
    attend = torch.rand(batch, 1, n, length, generator=g) < 0.7  # (B, 1, n, L), True: attend
    attend[..., 0] = True  # every row attends somewhere
    float_mask = torch.zeros(attend.shape).masked_fill(~attend, torch.finfo(torch.float32).min)
    attention_mask = {"none": None, "bool": attend, "float": float_mask}[mask]
    module = Module(per_group).eval()
    out, weights = grouped_attention(module, query, key, value, attention_mask, scaling=d**-0.5)
    float_mask = None if mask == "none" else float_mask  # eager's own kind of mask
    want_out, want_weights = eager_attention_forward(module, query, key, value, float_mask, scaling=d**-0.5)
    assert out.shape == want_out.shape == (batch, n, heads, d) and out.is_contiguous()
    # the same d-term dot products; only the kernels' summation order may differ (measured on 300 random cases
    # at d = 64, L up to 308: outputs within 1.1e-6 of eager's, weights within 2.0e-6 relative; 120 bitwise equal)
    torch.testing.assert_close(out, want_out, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(weights, want_weights, rtol=2e-6, atol=1e-6)


def test_in_bf16_too():
    """bf16, as distillation runs where the CPU has bf16 instructions: measured bitwise equal here (200 random
    cases at d = 64); the tolerance is bf16's own rounding of the outputs, which another kernel may round apart."""
    g = torch.Generator().manual_seed(0)
    query = torch.randn(2, 3, 9, 64, generator=g).transpose(1, 2).bfloat16()  # (B, H, n, d)
    key, value = torch.randn(2, 2, 3, 40, 64, generator=g).bfloat16()
    out, weights = grouped_attention(Module(3), query, key, value, None, scaling=0.125)
    want_out, want_weights = eager_attention_forward(Module(3), query, key, value, None, scaling=0.125)
    assert out.dtype == weights.dtype == torch.bfloat16
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(weights, want_weights)


def test_a_row_with_no_key_stays_finite_with_a_boolean_mask():
    """A left pad's query row sees no key: eager's float mask gives it finite weights; so must a boolean one
    (NaNs there would reach the padded positions' cache values, and 0 · NaN would poison every row)."""
    query, key, value = torch.randn(1, 2, 2, 4), torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 4)
    attend = torch.tensor([[[[False, False, False], [True, True, False]]]])
    out, weights = grouped_attention(Module(2), query, key, value, attend, scaling=0.5)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()


@pytest.mark.parametrize(
    "kwargs, module_sinks, named",
    [
        ({"softcap": 30.0}, False, "softcap"),  # Gemma 2
        ({"s_aux": torch.zeros(2)}, False, "s_aux"),  # gpt-oss
        ({}, True, "sinks"),
        ({"position_bias": torch.zeros(1, 2, 1, 3)}, False, "position_bias"),
        ({"indices": torch.zeros(1, 1, 2, dtype=torch.long)}, False, "indices"),  # sparse top-k keys
        ({"softcap": None, "sliding_window": 4096, "position_ids": torch.arange(1)[None]}, True, "sinks"),
    ],
)
def test_what_eager_has_and_grouped_does_not_is_refused_by_name(kwargs, module_sinks, named):
    """Any keyword outside what plain attention passes, if it is not None, is refused, not ignored."""
    module = Module(2)
    if module_sinks:
        module.sinks = torch.nn.Parameter(torch.zeros(2))
    q, k = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 3, 4)
    with pytest.raises(UnsupportedAttention, match=f"{GROUPED} attention has no {named} \\(Module\\)"):
        grouped_attention(module, q, k, k, None, scaling=0.5, **kwargs)
    assert issubclass(UnsupportedAttention, NotImplementedError)
    with pytest.raises(ValueError, match="3 query heads do not split into 2 key/value groups"):
        grouped_attention(
            Module(1), torch.randn(1, 3, 1, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), None, scaling=0.5
        )


def test_batched_left_padded_greedy_generation_equals_eagers():
    """A GQA Llama (6 query heads on 2 key/value heads) generating for prompts of unequal lengths in one
    left-padded batch, as distillation does: the same tokens as with eager attention."""
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    ids = torch.randint(2, 64, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    for row, pad in enumerate((0, 3, 5, 1)):  # left padding of unequal widths
        ids[row, :pad], mask[row, :pad] = 0, 0
    outputs = {}
    for attention in ("eager", register()):
        model.set_attn_implementation(attention)
        assert model.config._attn_implementation == attention  # taken, not warned about and left as it was
        with torch.no_grad():
            outputs[attention] = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=20, do_sample=False, pad_token_id=0
            )
    assert outputs["eager"].shape == (4, 29)
    assert torch.equal(outputs["eager"], outputs[GROUPED])
    assert register() == GROUPED  # again: idempotent
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS[GROUPED] is grouped_attention


@settings(max_examples=40, deadline=None)
@given(
    groups=st.integers(1, 3),
    per_group=st.integers(1, 4),
    n=st.integers(1, 9),
    past=st.integers(0, 40),
    mask=st.sampled_from(["none", "float", "bool"]),
    seed=st.integers(0, 2**16),
)
def test_sdpa_grouped_gives_transformers_sdpa_bit_for_bit(groups, per_group, n, past, mask, seed):
    """SDPA_GROUPED: a masked call reads the key/value heads in place (enable_gqa) where transformers repeats
    them; the same kernel on the same numbers, so the outputs are equal bit for bit (a verify block after the
    cache is such a call), and an unmasked call is transformers' own."""
    g = torch.Generator().manual_seed(seed)
    heads, length, d = groups * per_group, past + n, 64
    query = torch.randn(1, n, heads, d, generator=g).transpose(1, 2)  # (B, H, n, d)
    key, value = torch.randn(2, 1, groups, length, d, generator=g)
    attend = torch.ones(n, length, dtype=torch.bool).tril(past)[None, None]  # (1, 1, n, L): causal block
    attention_mask = {
        "none": None,
        "bool": attend,
        "float": torch.zeros(attend.shape).masked_fill(~attend, torch.finfo(torch.float32).min),
    }[mask]
    module = Module(per_group).eval()
    out, weights = sdpa_grouped_attention(module, query, key, value, attention_mask, scaling=d**-0.5)
    want, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=d**-0.5)
    assert weights is None and out.shape == (1, n, heads, d) and out.is_contiguous()
    assert torch.equal(out, want)


def test_sdpa_grouped_leaves_what_it_does_not_do_to_transformers():
    """A keyword beyond plain attention (here a position bias) goes to transformers' sdpa as it is."""
    module, g = Module(2), torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 4, 3, 8, generator=g), torch.randn(1, 2, 5, 8, generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool).tril(2)[None, None]
    bias = torch.randn(1, 4, 3, 5, generator=g)
    out, _ = sdpa_grouped_attention(module, query, key, key, mask, scaling=0.3, position_bias=bias)
    want, _ = sdpa_attention_forward(module, query, key, key, mask, scaling=0.3, position_bias=bias)
    assert torch.equal(out, want)


def test_hf_target_switches_an_sdpa_model_and_verifies_bit_for_bit():
    """HFTarget puts a model on "sdpa" on SDPA_GROUPED (an eager one stays eager): a verify block of 4 after
    the cache gives the same logits and hidden states as transformers' sdpa, bit for bit."""
    from dflash_ref.loading.hf import HFTarget

    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    target = HFTarget(model)
    assert model.config._attn_implementation == SDPA_GROUPED
    ids = torch.randint(0, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    outputs = {}
    for attention in ("sdpa", SDPA_GROUPED):
        model.set_attn_implementation(attention)
        cache = target.make_cache()
        with torch.no_grad():
            target(ids[:, :16], past_key_values=cache)
            outputs[attention] = target(ids[:, 16:], past_key_values=cache, output_hidden_states=True)
    assert torch.equal(outputs["sdpa"].logits, outputs[SDPA_GROUPED].logits)
    assert all(torch.equal(a, b) for a, b in zip(outputs["sdpa"].hidden_states, outputs[SDPA_GROUPED].hidden_states))
    model.set_attn_implementation("eager")
    assert not use_sdpa_grouped(model) and model.config._attn_implementation == "eager"
