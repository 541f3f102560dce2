"""One `load_target(folder)`: the folder's architecture picks the target (loading/folder.py), and a folder
nothing here can run is refused naming its architecture."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import make_pair
from test_hybrid_folder import hf_model
from test_llama_target import LLAMAS, hf_llama

from dflash_ref import HFTarget, LlamaTarget, Qwen3Target, load_target, save_draft, save_target
from dflash_ref.loading.folder import TransformersFallback
from dflash_ref.target import Qwen3_5Target
from dflash_ref.target.checkpoint import CheckpointError

transformers = pytest.importorskip("transformers")


def logits(target, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return target(ids, output_hidden_states=False).logits


def test_each_architecture_loads_on_its_own_target(tmp_path):
    """Qwen3 → the own Qwen3, Llama → the own Llama, Qwen3.5 → the own hybrid, each with the folder's weights."""
    ids = torch.tensor([[1, 5, 2, 7]])
    qwen3 = make_pair(0)[0]
    save_target(qwen3, tmp_path / "qwen3")
    loaded = load_target(tmp_path / "qwen3")
    assert type(loaded) is Qwen3Target and torch.equal(logits(loaded, ids), logits(qwen3, ids))
    llama = hf_llama(*LLAMAS[0])
    llama.save_pretrained(tmp_path / "llama")
    loaded = load_target(tmp_path / "llama", torch.float32)
    assert type(loaded) is LlamaTarget and torch.equal(logits(loaded, ids), llama(ids).logits.detach())
    hf_model("text").save_pretrained(tmp_path / "hybrid")
    assert type(load_target(tmp_path / "hybrid", torch.float32)) is Qwen3_5Target
    assert type(load_target(tmp_path / "llama", torch.float32, via_transformers=True)) is HFTarget


def test_a_llama_the_own_target_refuses_and_other_architectures_run_in_transformers(tmp_path):
    llama = hf_llama(*LLAMAS[0])
    llama.save_pretrained(tmp_path / "llama3")
    config = json.loads((tmp_path / "llama3" / "config.json").read_text())
    config["rope_parameters"] = dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=64,
    )  # fmt: skip
    (tmp_path / "llama3" / "config.json").write_text(json.dumps(config))
    with pytest.warns(TransformersFallback, match="not on the own Llama .*llama3"):
        assert type(load_target(tmp_path / "llama3", torch.float32)) is HFTarget
    torch.manual_seed(0)
    qwen2 = transformers.Qwen2ForCausalLM(
        transformers.Qwen2Config(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
        )  # fmt: skip
    ).eval()
    qwen2.save_pretrained(tmp_path / "qwen2")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TransformersFallback)  # not a fallback: transformers is its only runner
        target = load_target(tmp_path / "qwen2", torch.float32)
    ids = torch.tensor([[3, 1, 4]])
    assert type(target) is HFTarget and torch.equal(logits(target, ids), qwen2(ids).logits.detach())


def test_a_folder_nothing_can_run_is_refused_naming_its_architecture(tmp_path):
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(
        json.dumps({"architectures": ["OddForCausalLM"], "model_type": "odd"})
    )
    with pytest.raises(CheckpointError, match=r"architectures \['OddForCausalLM'\]"):
        load_target(tmp_path / "odd")
    save_draft(make_pair(0)[1], tmp_path / "draft")
    with pytest.raises(CheckpointError, match=r"\['DFlashDraftModel'\] is a DFlash draft, not a target"):
        load_target(tmp_path / "draft")
    with pytest.raises(CheckpointError, match="no folder"):
        load_target(tmp_path / "missing")
