"""The own Llama target (target/llama.py) against transformers' LlamaForCausalLM: logits and every hidden
state bit for bit, with and without a KV cache, after crops, on weights shared with the transformers model
or read from its saved folder; the configs it refuses by name; its hook points on the explicit path.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_close

from dflash_ref.config import ConfigError
from dflash_ref.hooks import hooks
from dflash_ref.target.checkpoint import CheckpointError
from dflash_ref.target.llama import LlamaTarget, from_transformers, load_llama_target

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread_module")

# (seed, tie_word_embeddings, num_attention_heads, num_key_value_heads, rope_parameters)
LLAMAS = [
    (0, True, 4, 2, {"rope_type": "default", "rope_theta": 10000.0}),  # SmolLM2's kind: tied, GQA
    (1, False, 4, 4, {"rope_type": "default", "rope_theta": 500000.0}),  # MHA, untied
    (2, True, 6, 1, {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),  # MQA, linear RoPE
]


def hf_llama(seed, tie, heads, kv_heads, rope, **extra):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=8 * heads,
        intermediate_size=40,
        num_hidden_layers=3,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=8,
        max_position_embeddings=256,
        tie_word_embeddings=tie,
        rope_parameters=rope,
        rms_norm_eps=1e-5,
        **extra,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model


def same_outputs(ours, theirs) -> None:
    assert torch.equal(ours.logits, theirs.logits)
    assert len(ours.hidden_states) == len(theirs.hidden_states)
    for i, (a, b) in enumerate(zip(ours.hidden_states, theirs.hidden_states)):
        assert torch.equal(a, b), f"hidden_states[{i}]"


@pytest.mark.parametrize("seed,tie,heads,kv_heads,rope", LLAMAS)
def test_the_own_llama_is_transformers_bit_for_bit_with_a_cache_and_crops(seed, tie, heads, kv_heads, rope):
    model = hf_llama(seed, tie, heads, kv_heads, rope)
    ours = from_transformers(model)  # both sides F.linear: the same products
    assert ours.model.embed_tokens.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # not copied
    assert set(ours.state_dict()) == set(model.state_dict())  # no q_norm / k_norm
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 96, (2, 11), generator=g)
    with torch.inference_mode():
        same_outputs(ours(ids), model(ids, output_hidden_states=True))
        mine, theirs = ours.make_cache(), transformers.DynamicCache(config=model.config)
        same_outputs(
            ours(ids[:1], past_key_values=mine), model(ids[:1], past_key_values=theirs, output_hidden_states=True)
        )
        for q in (1, 4, 1, 3):
            block = torch.randint(0, 96, (1, q), generator=g)
            same_outputs(
                ours(block, past_key_values=mine),
                model(block, past_key_values=theirs, use_cache=True, output_hidden_states=True),
            )
            mine.crop(mine.get_seq_length() - 1)  # reject the block's last token, as a verify does
            theirs.crop(-1)


def test_a_saved_llama_folder_loads_as_the_own_target_plain(tmp_path):
    model = hf_llama(*LLAMAS[0])
    model.save_pretrained(tmp_path)
    ours = load_llama_target(tmp_path, torch.float32)
    assert isinstance(ours, LlamaTarget) and type(ours.model.layers[0].mlp.up_proj) is torch.nn.Linear
    ids = torch.randint(0, 96, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        assert torch.equal(ours(ids).logits, model(ids).logits)  # the same products: bit for bit


def test_open_target_runs_a_llama_folder_on_the_own_target_and_training_in_transformers(tmp_path, capsys):
    from dflash_ref.loading.folder import open_target
    from dflash_ref.loading.hf import HFTarget
    from dflash_ref.loading.smollm2 import load_smollm2

    model = hf_llama(*LLAMAS[0])
    model.config.vocab_size = 49152  # the tokenizer's ids must fit: SmolLM2's, with a SmolLM2-sized vocabulary
    model.resize_token_embeddings(49152)
    model.save_pretrained(tmp_path)
    load_smollm2()[1].save_pretrained(tmp_path)
    assert isinstance(open_target(tmp_path, torch.float32, torch.device("cpu"))[0], LlamaTarget)
    assert isinstance(open_target(tmp_path, torch.float32, torch.device("cpu"), own=False)[0], HFTarget)
    config = json.loads((tmp_path / "config.json").read_text())  # Llama 3's RoPE: the own Llama refuses it
    config["rope_parameters"] = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert isinstance(open_target(tmp_path, torch.float32, torch.device("cpu"))[0], HFTarget)  # as before it came
    note = capsys.readouterr().err
    assert "not on the own Llama" in note and "llama3" in note


@pytest.mark.parametrize(
    "field,value,named",
    [
        ("mlp_bias", True, "mlp_bias"),
        ("attention_bias", True, "attention_bias"),
        ("hidden_act", "gelu", "hidden_act"),
        (
            "rope_parameters",
            {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "llama3",
        ),
    ],
)
def test_what_the_own_llama_cannot_compute_is_refused_by_name(tmp_path, field, value, named):
    model = hf_llama(*LLAMAS[0])
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config[field] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=named):
        load_llama_target(tmp_path)
    setattr(model.config, field, value)
    with pytest.raises(ConfigError, match=named):
        from_transformers(model)


def test_from_transformers_refuses_another_architecture():
    qwen3 = transformers.Qwen3ForCausalLM(
        transformers.Qwen3Config(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
        )
    )
    with pytest.raises(TypeError, match="Qwen3ForCausalLM"):
        from_transformers(qwen3)


def test_its_hook_points_give_the_attention_pattern_on_the_explicit_path():
    model = hf_llama(*LLAMAS[0])
    ours = from_transformers(model)
    ids = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(5))
    seen = {}
    with torch.inference_mode():
        plain = ours(ids).logits
        with hooks(ours, lambda t, point: seen.setdefault(point.name, t), names=lambda n: n.endswith("hook_pattern")):
            traced = ours(ids).logits
    assert sorted(seen) == [f"target.model.layers.{i}.self_attn.hook_pattern" for i in range(3)]
    pattern = seen["target.model.layers.0.self_attn.hook_pattern"]  # (B, H_q, L, L)
    assert pattern.shape == (1, 4, 7, 7)
    assert torch.allclose(pattern.sum(-1), torch.ones(1, 4, 7))
    assert torch.equal(pattern.triu(1), torch.zeros_like(pattern))  # causal: nothing after the query
    assert_close(traced, plain)  # the explicit path: the same sums


def test_a_model_whose_rope_frequencies_were_rounded_is_refused():
    """transformers keeps the RoPE frequencies in a buffer; `.to(bfloat16)` rounds it, and its cos/sin with it:
    the own target, which computes them from the config, would not be that model's numbers."""
    model = hf_llama(*LLAMAS[0]).to(torch.bfloat16)
    with pytest.raises(ValueError, match="inv_freq"):
        from_transformers(model)


def test_a_llama_config_without_max_positions_takes_llamas_default():
    from dflash_ref.target.llama import LlamaTargetConfig

    config = hf_llama(*LLAMAS[0]).config.to_dict()
    del config["max_position_embeddings"]
    assert (
        LlamaTargetConfig.from_dict(config).max_position_embeddings
        == transformers.LlamaConfig().max_position_embeddings
    )
