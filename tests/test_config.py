"""Configs: the released draft config.json, both RoPE spellings, validation with field-naming errors,
and a to_dict that transformers + the official dflash package read the same way."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import draft_config, target_config

from dflash_ref.config import ConfigError, DraftConfig, TargetConfig

# z-lab/Qwen3-8B-DFlash-b16 config.json (the fields listed in DESIGN.md, plus the usual Qwen3 extras)
RELEASED = {
    "architectures": ["DFlashDraftModel"],
    "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 5,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000,
    "rope_scaling": None,
    "sliding_window": None,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
    "vocab_size": 151936,
    "torch_dtype": "bfloat16",
    "block_size": 16,
    "num_target_layers": 36,
    "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
}


def released(**changes) -> dict:
    d = copy.deepcopy(RELEASED)
    for key, value in changes.items():
        if value is KeyError:
            d.pop(key, None)
        else:
            d[key] = value
    return d


def test_released_draft_config_is_read():
    c = DraftConfig.from_dict(released())
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers) == (4096, 12288, 5)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (32, 8, 128)
    assert c.vocab_size == 151936 and c.max_position_embeddings == 40960
    assert c.rope_theta == 1e6 and isinstance(c.rope_theta, float)
    assert c.rms_norm_eps == 1e-6
    assert c.block_size == 16 and c.num_target_layers == 36
    assert c.mask_token_id == 151669
    assert c.target_layer_ids == [1, 9, 17, 25, 33]
    assert c.tie_word_embeddings is False
    assert c.dtype == "bfloat16"
    assert c.is_causal is None and c.layer_types == ["full_attention"] * 5  # absent: all full
    assert c.layer_type(4) == "full_attention"


def test_target_layer_ids_default_to_the_formula():
    d = released()
    del d["dflash_config"]["target_layer_ids"]
    assert DraftConfig.from_dict(d).target_layer_ids == [1, 9, 17, 25, 33]


def test_dflash_config_wins_over_top_level_and_top_level_is_a_fallback():
    d = released(mask_token_id=5, block_size=8)
    d["dflash_config"]["block_size"] = 4
    c = DraftConfig.from_dict(d)
    assert (c.mask_token_id, c.block_size) == (151669, 4)
    d = released(mask_token_id=7, dflash_config=KeyError)
    c = DraftConfig.from_dict(d)
    assert c.mask_token_id == 7 and c.target_layer_ids == [1, 9, 17, 25, 33]


def test_transformers5_rope_parameters_spelling():
    d = released(rope_theta=KeyError, rope_parameters={"rope_theta": 500000.0, "rope_type": "default"})
    assert DraftConfig.from_dict(d).rope_theta == 5e5
    # when both spellings are present, rope_parameters (what transformers 5 writes) is used
    d = released(rope_parameters={"rope_theta": 250000.0, "rope_type": "default"})
    assert DraftConfig.from_dict(d).rope_theta == 2.5e5
    # no RoPE setting at all: the Qwen3 default base 10000
    assert DraftConfig.from_dict(released(rope_theta=KeyError)).rope_theta == 10000.0


@pytest.mark.parametrize(
    "changes,kind",
    [  # linear and yarn are read: tests/test_rope_scaling.py
        (dict(rope_parameters={"rope_theta": 1e6, "rope_type": "llama3", "factor": 8.0}), "llama3"),
        (dict(rope_parameters={"rope_theta": 1e6, "rope_type": "longrope", "factor": 2.0}), "longrope"),
        (dict(rope_scaling={"type": "dynamic", "factor": 2.0}), "dynamic"),
        (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "dynamic"),
    ],
)
def test_unimplemented_rope_types_are_refused(changes, kind):
    with pytest.raises(ConfigError, match=f"rope type '{kind}'; implemented are 'default' .*'linear' and 'yarn'"):
        DraftConfig.from_dict(released(**changes))
    with pytest.raises(ConfigError, match=f"'{kind}'"):
        TargetConfig.from_dict(released(architectures=["Qwen3ForCausalLM"], **changes))


def test_missing_mask_token_id():
    d = released()
    del d["dflash_config"]["mask_token_id"]
    with pytest.raises(ConfigError, match="mask_token_id"):
        DraftConfig.from_dict(d)


@pytest.mark.parametrize("ids", [[1, 36], [-1, 9], [1, "9"], [1.0, 9], [True]])
def test_target_layer_ids_out_of_range_or_wrong_type(ids):
    d = released()
    d["dflash_config"]["target_layer_ids"] = ids
    with pytest.raises(ConfigError, match=r"target_layer_ids .*0\.\.35 \(num_target_layers=36\)"):
        DraftConfig.from_dict(d)


@pytest.mark.parametrize("mask", [151936, -1, "151669", 1.5, None])
def test_mask_token_outside_vocab_or_wrong_type(mask):
    d = released()
    d["dflash_config"]["mask_token_id"] = mask
    with pytest.raises(ConfigError, match="mask_token_id"):
        DraftConfig.from_dict(d)


def test_heads_must_be_divisible_by_kv_heads():
    with pytest.raises(
        ConfigError,
        match=r"num_attention_heads \(32\) must be a multiple of "
        r"num_key_value_heads \(7\)",
    ):
        DraftConfig.from_dict(released(num_key_value_heads=7))


def test_odd_head_dim():
    with pytest.raises(ConfigError, match="head_dim must be even for RoPE, got 127"):
        DraftConfig.from_dict(released(head_dim=127))


@pytest.mark.parametrize(
    "field,value",
    [
        ("hidden_size", "4096"),
        ("hidden_size", 4096.0),
        ("vocab_size", 0),
        ("num_hidden_layers", True),
        ("intermediate_size", None),
        ("num_attention_heads", -32),
        ("num_key_value_heads", "8"),
        ("head_dim", [128]),
        ("max_position_embeddings", 0.5),
        ("block_size", 16.0),
        ("block_size", 0),
        ("num_target_layers", "36"),
        ("num_target_layers", KeyError),
        ("rms_norm_eps", "1e-6"),
        ("rms_norm_eps", 0),
        ("rms_norm_eps", True),
        ("rope_theta", "1e6"),
        ("rope_theta", -1.0),
        ("vocab_size", KeyError),
        ("hidden_size", KeyError),
    ],
)
def test_wrong_types_and_missing_fields_name_the_field(field, value):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        DraftConfig.from_dict(released(**{field: value}))


@pytest.mark.parametrize(
    "field,value",
    [
        ("target_layer_ids", 5),
        ("dflash_config", [151669]),
        ("rope_scaling", "linear"),
        ("tie_word_embeddings", "false"),
        ("is_causal", "false"),
    ],
)
def test_more_wrong_types_name_the_field(field, value):
    d = released(**{field: value})
    if field == "target_layer_ids":
        d = released()
        d["dflash_config"]["target_layer_ids"] = value
    with pytest.raises(ConfigError, match=field):
        DraftConfig.from_dict(d)


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (dict(attention_bias=True), "attention_bias=true is not supported"),
        (dict(use_sliding_window=True), "use_sliding_window without layer_types"),
        (dict(input_embedding_scale=-2.0), "'input_embedding_scale' must be a positive number"),
        (dict(conv_kernel_size=4), "DFlash 2's fields need architectures"),
        (dict(layer_types=["full_attention"] * 4), "layer_types has 4 entries for 5 layers"),
        (dict(layer_types=["full_attention"] * 4 + ["chunked"]), r"unknown layer_types \['chunked'\]"),
        (
            dict(
                layer_types=["full_attention"] * 4 + ["sliding_attention"],
                use_sliding_window=True,
                sliding_window="4096",
            ),
            "'sliding_window'",
        ),
    ],
)
def test_unsupported_settings_are_refused(changes, match):
    with pytest.raises(ConfigError, match=match):
        DraftConfig.from_dict(released(**changes))


def test_a_config_must_be_an_object():
    with pytest.raises(ConfigError, match="a config must be a JSON object, got list"):
        DraftConfig.from_dict([1, 2])


def test_target_refuses_sliding_layers():
    with pytest.raises(ConfigError, match="sliding-window layers in the target are not implemented"):
        target_config(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=8)


def test_to_dict_from_dict_round_trip_is_stable():
    for config in (
        target_config(),
        target_config(tie_word_embeddings=True, dtype="bfloat16"),
        draft_config(),
        draft_config(target_layer_ids=[0, 3], block_size=8, is_causal=False),
        DraftConfig.from_dict(released()),
    ):
        d = config.to_dict()
        again = type(config).from_dict(json.loads(json.dumps(d)))  # through JSON, as on disk
        assert again.to_dict() == d
    # written fields, by hand
    d = draft_config(target_layer_ids=[0, 3], block_size=8).to_dict()
    assert d["architectures"] == ["DFlashDraftModel"] and d["model_type"] == "qwen3"
    assert d["dflash_config"] == {"mask_token_id": 11, "target_layer_ids": [0, 3]}
    assert d["block_size"] == 8 and d["num_target_layers"] == 4
    assert d["rope_theta"] == 10000.0
    assert d["rope_parameters"] == {"rope_theta": 10000.0, "rope_type": "default"}
    assert "mask_token_id" not in d and "target_layer_ids" not in d and "is_causal" not in d
    assert target_config().to_dict()["architectures"] == ["Qwen3ForCausalLM"]


def test_round_trip_gives_an_equal_config_when_layer_types_are_explicit():
    c = draft_config(layer_types=["full_attention", "full_attention"])
    assert DraftConfig.from_dict(c.to_dict()) == c
    t = target_config(layer_types=["full_attention"] * 4)
    assert TargetConfig.from_dict(t.to_dict()) == t


def test_round_trip_gives_an_equal_config():
    assert DraftConfig.from_dict(draft_config().to_dict()) == draft_config()
    assert TargetConfig.from_dict(target_config().to_dict()) == target_config()


def test_from_json_reads_a_folder_or_a_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(released()))
    assert DraftConfig.from_json(tmp_path).target_layer_ids == [1, 9, 17, 25, 33]
    assert DraftConfig.from_json(tmp_path / "config.json").mask_token_id == 151669
    draft_config().save(tmp_path / "saved")
    assert DraftConfig.from_json(tmp_path / "saved").to_dict() == draft_config().to_dict()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        DraftConfig.from_json(tmp_path / "nothing")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="bad.json is not valid JSON"):
        DraftConfig.from_json(tmp_path / "bad.json")


def test_official_dflash_reads_our_to_dict_the_same_way():
    transformers = pytest.importorskip("transformers")
    official = pytest.importorskip("dflash.model")
    from dflash_ref import DFlashDraftModel

    config = draft_config(target_layer_ids=[0, 2, 3], block_size=8, mask_token_id=7)
    hf_config = transformers.Qwen3Config(**config.to_dict())
    assert hf_config.num_target_layers == 4
    theirs = official.DFlashDraftModel(hf_config)
    assert list(theirs.target_layer_ids) == [0, 2, 3]
    assert theirs.block_size == 8
    assert theirs.mask_token_id == 7
    assert theirs.fc.in_features == 3 * 32
    assert hf_config.rope_parameters["rope_theta"] == config.rope_theta
    # same parameter names and shapes: one load_state_dict moves weights across
    ours = DFlashDraftModel(config)
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in theirs.state_dict().items()}
    # the released config, read by transformers, agrees with ours on the RoPE base
    hf_released = transformers.Qwen3Config(**released())
    assert hf_released.rope_parameters["rope_theta"] == DraftConfig.from_dict(released()).rope_theta
