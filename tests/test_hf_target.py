"""Any transformers causal LM as the target: the adapter must give exactly what the own target gives."""

from __future__ import annotations

import pytest
import torch
from conftest import make_pair, official_twins

from dflash_ref import generate, spec_generate
from dflash_ref.drafts.oracle import OracleDraft
from dflash_ref.loading.hf import HFTarget
from dflash_ref.target.checkpoint import CheckpointError, check_device
from dflash_ref.trace import tracing

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("temperature,verifier", [(0.0, "rejection"), (1.0, "rejection"), (0.8, "match")])
def test_adapter_and_own_target_give_identical_speculative_output(seed, temperature, verifier):
    target, draft = make_pair(
        seed, target_overrides={"tie_word_embeddings": seed % 2 == 0}, draft_overrides={"block_size": 3 + seed % 4}
    )
    # plain F.linear in both, as the own target computes it, so that logits are bitwise equal
    hf_target = HFTarget(official_twins(target, draft)[0])
    ids = torch.randint(0, 12, (1, 3 + seed), generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    own = spec_generate(draft, target, ids, 25, [5], temperature=temperature, verifier=verifier)
    torch.manual_seed(seed)
    via_hf = spec_generate(draft, hf_target, ids, 25, [5], temperature=temperature, verifier=verifier)
    assert torch.equal(own.output_ids, via_hf.output_ids)
    assert own.acceptance_lengths == via_hf.acceptance_lengths


def test_adapter_with_full_acceptance_and_a_llama_model():
    """Not only Qwen3: a LlamaForCausalLM (no q/k norm) through the adapter, lossless with full blocks."""
    config = transformers.LlamaConfig(
        vocab_size=16,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(config).eval()
    for p in llama.parameters():
        torch.nn.init.normal_(p, std=0.4)
    target = HFTarget(llama)
    from dflash_ref.drafts.random_draft import random_draft

    draft = random_draft(target, num_hidden_layers=2, block_size=5)
    ids = torch.tensor([[1, 2, 3]])
    ar = generate(target, ids, 30)
    assert torch.equal(spec_generate(draft, target, ids, 30).output_ids, ar.output_ids)
    full = spec_generate(OracleDraft(draft, ar.output_ids), target, ids, 30)
    assert torch.equal(full.output_ids, ar.output_ids) and full.acceptance_lengths[:5] == [4] * 5


def test_hf_cache_crops_to_a_length():
    target, draft = make_pair(1)
    hf_target = HFTarget(official_twins(target, draft)[0])
    cache = hf_target.make_cache()
    hf_target(torch.tensor([[1, 2, 3, 4, 5]]), past_key_values=cache)
    assert cache.get_seq_length() == 5
    cache.crop(5)
    assert cache.get_seq_length() == 5
    cache.crop(2)
    assert cache.get_seq_length() == 2
    with pytest.raises(ValueError, match="cannot crop a cache of length 2 to 3"):
        cache.crop(3)


def test_adapter_refuses_what_it_cannot_drive_and_tracing_says_why():
    with pytest.raises(TypeError, match="not a causal LM"):
        HFTarget(
            transformers.Qwen3Model(
                transformers.Qwen3Config(
                    vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
                )
            )
        )
    target, draft = make_pair(2)
    hf_target = HFTarget(official_twins(target, draft)[0])
    with pytest.raises(ValueError, match="no hook points"):
        with tracing(draft, hf_target):
            pass


def test_a_device_or_dtype_that_cannot_run_is_refused():
    with pytest.raises(CheckpointError, match="unknown device"):
        check_device("tpu0", torch.float32)
    if not torch.cuda.is_available():
        with pytest.raises(CheckpointError, match="no usable CUDA device"):
            check_device("cuda", torch.bfloat16)
    if not torch.backends.mps.is_available():  # it used to pass here and fail inside torch
        with pytest.raises(CheckpointError, match="no usable MPS device"):
            check_device("mps", torch.float32)
    with pytest.raises(CheckpointError, match="the CPU is one device"):
        check_device("cpu:3", torch.float32)
    assert check_device("cpu", torch.bfloat16) == torch.device("cpu")
    assert check_device("cpu:0", torch.float32) == torch.device("cpu")  # safetensors takes "cpu" only
    from dflash_ref import load_draft
    from dflash_ref.drafts.folder import SHIPPED_DRAFT

    assert load_draft(SHIPPED_DRAFT, device="cpu:0").fc.weight.device == torch.device("cpu")


# the fast CPU path's own tests (kernels, plans, copies): tests/test_fast_cpu_linear.py


def test_an_hf_target_stays_plain_and_use_fast_cpu_switches_its_linear_layers():
    """HFTarget leaves the model's nn.Linear layers as they are; use_fast_cpu switches every plain
    nn.Linear (lm_head included) to PlannedLinear in place: same parameters (tying kept), same state
    dict, logits equal to the plain model's up to rounding at 1, 8 and 70 rows; use_fast_cpu(·, False)
    switches them back."""
    from dflash_ref.fast_cpu import PlannedLinear, use_fast_cpu

    config = transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    plain, switched = transformers.LlamaForCausalLM(config).eval(), transformers.LlamaForCausalLM(config).eval()
    switched.load_state_dict(plain.state_dict())
    weight, keys = switched.lm_head.weight, set(switched.state_dict())
    target = HFTarget(switched)
    assert all(type(m) is not PlannedLinear for m in target.modules())
    assert use_fast_cpu(target) is target
    linears = [m for m in switched.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 2 * 7 + 1 and all(type(m) is PlannedLinear for m in linears)  # q k v o gate up down, head
    assert switched.lm_head.weight is weight is switched.model.embed_tokens.weight
    assert set(switched.state_dict()) == keys
    with pytest.raises(TypeError, match="use_fast_cpu takes a torch module"):
        use_fast_cpu("a target")
    for n in (1, 8, 70):
        ids = torch.randint(0, 300, (1, n), generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            torch.testing.assert_close(
                target(ids, output_hidden_states=False).logits, plain(ids).logits, rtol=1e-5, atol=1e-5
            )
    use_fast_cpu(target, False)
    assert all(type(m) is torch.nn.Linear for m in switched.modules() if isinstance(m, torch.nn.Linear))
