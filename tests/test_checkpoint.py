"""Checkpoints: config.json + safetensors (single file or sharded), round trips, and clear errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import make_pair, randomize_, target_config
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from dflash_ref import DraftConfig, Qwen3Target, load_draft, load_target, save_draft, save_target
from dflash_ref.config import ConfigError
from dflash_ref.target.checkpoint import CheckpointError, resolve_dtype


@pytest.fixture(scope="module")
def pair():
    return make_pair(seed=5)


def assert_same_state(model, reference, dtype=None, via=None):
    """model's tensors equal reference's, cast (through `via` first, if given) to `dtype`."""
    ours, theirs = model.state_dict(), reference.state_dict()
    assert sorted(ours) == sorted(theirs)
    for name, tensor in theirs.items():
        expected = tensor.to(via) if via is not None else tensor
        expected = expected.to(dtype) if dtype is not None else expected
        assert ours[name].dtype == expected.dtype, name
        assert torch.equal(ours[name], expected), name


def tensor_names(folder: Path) -> set[str]:
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return set(f.keys())


# ---------------------------------------------------------------- round trips


def test_draft_round_trip_fp32(pair, tmp_path):
    _, draft = pair
    save_draft(draft, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dtype"] == "float32"
    loaded = load_draft(tmp_path)
    assert not loaded.training
    assert_same_state(loaded, draft)
    assert loaded.config.to_dict() == {**draft.config.to_dict(), "dtype": "float32"}
    # the same numbers come out
    g = torch.Generator().manual_seed(0)
    kw = dict(
        noise_embedding=torch.randn(1, 4, 32, generator=g),
        target_hidden=torch.randn(1, 3, loaded.fc.in_features, generator=g),
    )
    with torch.no_grad():
        assert torch.equal(loaded(torch.arange(7)[None], **kw), draft(torch.arange(7)[None], **kw))


def test_draft_round_trip_bf16_and_dtype_option(pair, tmp_path):
    _, draft = pair
    save_draft(draft, tmp_path, dtype=torch.bfloat16)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = load_draft(tmp_path)  # None: the config's dtype
    assert loaded.config.dtype == "bfloat16"
    assert_same_state(loaded, draft, torch.bfloat16)
    # explicit dtype: strings, aliases and torch dtypes
    # bf16 on disk, float32 in memory: the bf16-rounded values, widened
    assert_same_state(load_draft(tmp_path, dtype="float32"), draft, torch.float32, via=torch.bfloat16)
    assert next(load_draft(tmp_path, dtype="fp16").parameters()).dtype == torch.float16
    assert next(load_draft(tmp_path, dtype=torch.float32).parameters()).dtype == torch.float32
    assert next(load_draft(tmp_path, dtype="auto").parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_target_round_trip(tied, dtype, tmp_path):
    target = randomize_(Qwen3Target(target_config(tie_word_embeddings=tied)), seed=11)
    save_target(target, tmp_path, dtype=dtype)
    # a tied target stores the embedding once (no lm_head.weight in the file), as transformers does
    assert ("lm_head.weight" in tensor_names(tmp_path)) == (not tied)
    loaded = load_target(tmp_path)
    assert loaded.config.tie_word_embeddings is tied
    assert_same_state(loaded, target, dtype)
    if tied:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.tensor([[1, 4, 2, 9]])
    with torch.no_grad():
        expected = target.to(dtype or torch.float32)(ids).logits  # (a local model: casting it is fine)
        assert torch.equal(loaded(ids).logits, expected)


def test_sharded_checkpoint_loads(pair, tmp_path):
    _, draft = pair
    save_draft(draft, tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2 :]
    save_file({n: state[n] for n in first}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({n: state[n] for n in second}, str(tmp_path / "model-00002-of-00002.safetensors"))
    weight_map = {
        **{n: "model-00001-of-00002.safetensors" for n in first},
        **{n: "model-00002-of-00002.safetensors" for n in second},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same_state(load_draft(tmp_path), draft)


def test_folders_interoperate_with_transformers_and_official(pair, tmp_path):
    transformers = pytest.importorskip("transformers")
    official = pytest.importorskip("dflash.model")
    target, draft = pair
    # ours → theirs
    save_target(target, tmp_path / "target")
    save_draft(draft, tmp_path / "draft")
    hf = transformers.Qwen3ForCausalLM.from_pretrained(tmp_path / "target")
    off = official.DFlashDraftModel.from_pretrained(tmp_path / "draft")
    assert_same_state(hf, target)
    assert_same_state(off, draft)
    assert list(off.target_layer_ids) == draft.target_layer_ids and off.mask_token_id == draft.mask_token_id
    # theirs → ours
    hf.save_pretrained(tmp_path / "hf_target")
    off.save_pretrained(tmp_path / "off_draft")
    assert_same_state(load_target(tmp_path / "hf_target"), target)
    assert_same_state(load_draft(tmp_path / "off_draft"), draft)


# ---------------------------------------------------------------- errors


@pytest.fixture
def draft_folder(pair, tmp_path):
    save_draft(pair[1], tmp_path / "draft")
    return tmp_path / "draft"


def rewrite_weights(folder: Path, edit) -> None:
    state = load_file(str(folder / "model.safetensors"))
    edit(state)
    save_file(state, str(folder / "model.safetensors"))


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match=f"no folder {tmp_path / 'nope'}"):
        load_draft(tmp_path / "nope")


def test_no_config_json(draft_folder):
    (draft_folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match="has no config.json"):
        load_draft(draft_folder)


def test_no_weights(draft_folder):
    (draft_folder / "model.safetensors").unlink()
    with pytest.raises(
        CheckpointError,
        match=r"has neither model.safetensors nor model.safetensors.index.json "
        r"\(found: \['config.json'\]\)",
    ):
        load_draft(draft_folder)


def test_only_pickle_weights(draft_folder):
    (draft_folder / "model.safetensors").unlink()
    (draft_folder / "pytorch_model.bin").write_bytes(b"not really a pickle")
    with pytest.raises(CheckpointError, match=r"holds pickle weights .*pytorch_model.bin.*only safetensors"):
        load_draft(draft_folder)


def test_missing_tensors_are_listed(draft_folder):
    def drop(state):
        del state["norm.weight"]
        del state["layers.1.mlp.up_proj.weight"]

    rewrite_weights(draft_folder, drop)
    with pytest.raises(
        CheckpointError,
        match=r"missing: \['layers.1.mlp.up_proj.weight', 'norm.weight'\]; "
        r"unexpected: none",
    ):
        load_draft(draft_folder)


def test_unexpected_tensors_are_listed(draft_folder):
    rewrite_weights(draft_folder, lambda state: state.update({"embed_tokens.weight": torch.zeros(12, 32)}))
    with pytest.raises(CheckpointError, match=r"missing: none; unexpected: \['embed_tokens.weight'\]"):
        load_draft(draft_folder)


def test_whole_number_tensors_are_refused_not_cast(draft_folder):
    rewrite_weights(draft_folder, lambda state: state.update({"fc.weight": torch.ones(32, 64, dtype=torch.int32)}))
    with pytest.raises(
        CheckpointError,
        match=r"holds tensors that are not floating point: "
        r"\['fc.weight \(torch.int32\)'\]",
    ):
        load_draft(draft_folder)


def test_a_draft_holding_nan_or_infinity_is_refused(draft_folder):
    """Its proposals would be NaN: greedy decoding ran on silently, sampling failed deep in torch."""
    rewrite_weights(draft_folder, lambda state: state["fc.weight"].fill_(float("nan")))
    with pytest.raises(
        CheckpointError, match=r"tensors holding NaN or infinity as loaded in torch.float32: \['fc.weight'\]"
    ):
        load_draft(draft_folder)


def test_wrong_shapes_are_listed(draft_folder):
    rewrite_weights(draft_folder, lambda state: state.update({"fc.weight": torch.zeros(32, 96)}))
    with pytest.raises(
        CheckpointError,
        match=r"tensor shapes do not match the config: "
        r"\['fc.weight: file \(32, 96\) vs model \(32, 64\)'\]",
    ):
        load_draft(draft_folder)


def test_wrong_architecture(draft_folder, pair, tmp_path):
    with pytest.raises(CheckpointError, match=r"architectures \['DFlashDraftModel'\] is a DFlash draft, not a target"):
        load_target(draft_folder)
    save_target(pair[0], tmp_path / "target")
    with pytest.raises(
        CheckpointError,
        match=r"architectures \['Qwen3ForCausalLM'\] is not one of "
        r"\['DFlash2DraftModel', 'DFlashDraftModel'\]",
    ):
        load_draft(tmp_path / "target")


def test_missing_shard_file(draft_folder):
    state = load_file(str(draft_folder / "model.safetensors"))
    (draft_folder / "model.safetensors").unlink()
    names = sorted(state)
    save_file({n: state[n] for n in names[:3]}, str(draft_folder / "model-00001-of-00002.safetensors"))
    weight_map = {
        n: "model-00001-of-00002.safetensors" if i < 3 else "model-00002-of-00002.safetensors"
        for i, n in enumerate(names)
    }
    (draft_folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(
        CheckpointError,
        match=r"shard files listed in model.safetensors.index.json are missing: "
        r"\['model-00002-of-00002.safetensors'\]",
    ):
        load_draft(draft_folder)


def test_index_without_weight_map(draft_folder):
    (draft_folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match="model.safetensors.index.json has no weight_map"):
        load_draft(draft_folder)


@pytest.mark.parametrize("dtype", ["float64", "int8", "half-precision"])
def test_unknown_dtype_string(draft_folder, dtype):
    with pytest.raises(CheckpointError, match=f"unknown dtype '{dtype}'; choose one of \\['bf16', 'bfloat16'"):
        load_draft(draft_folder, dtype=dtype)


def test_resolve_dtype():
    config = DraftConfig.from_dict({**make_pair()[1].config.to_dict(), "dtype": "bfloat16"})
    assert resolve_dtype(None, config) == torch.bfloat16
    assert resolve_dtype("auto", config) == torch.bfloat16
    assert resolve_dtype("fp32", config) == torch.float32
    assert resolve_dtype(torch.float16, config) == torch.float16
    config.dtype = None
    assert resolve_dtype(None, config) == torch.float32


def test_corrupt_config_json_names_the_file(draft_folder):
    (draft_folder / "config.json").write_text("{not json")
    with pytest.raises((CheckpointError, ConfigError), match="config.json"):
        load_draft(draft_folder)


def edit_config(folder: Path, edit) -> None:
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["dflash_config"].update(target_layer_ids=[1, 40]), r"target_layer_ids \[1, 40\]"),
        (lambda c: c["dflash_config"].update(mask_token_id=99), "mask_token_id 99 is outside the vocabulary"),
        (lambda c: c.update(block_size="4"), "'block_size' must be an integer"),
        (lambda c: c.update(head_dim=7), "head_dim must be even"),
        (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
        (lambda c: c.update(layer_types=5), "'layer_types' must be a list, got 5"),
        (
            lambda c: c.update(layer_types=[["full_attention"], "full_attention"]),
            re.escape("unknown layer_types [['full_attention']]"),
        ),
        (lambda c: c.update(dtype=[1]), re.escape("'dtype' must be a name such as \"bfloat16\", got [1]")),
    ],
)
def test_a_bad_draft_config_is_a_checkpoint_error_naming_the_file(draft_folder, edit, message):
    """The commands catch CheckpointError: a bad config.json in a folder is one (and still a ConfigError,
    for callers of the Python API), naming the file and keeping the config's own message."""
    edit_config(draft_folder, edit)
    with pytest.raises(CheckpointError, match=f"{draft_folder / 'config.json'}: .*{message}") as e:
        load_draft(draft_folder)
    assert isinstance(e.value, ConfigError)


def test_a_bad_target_config_is_a_checkpoint_error_naming_the_file(pair, tmp_path):
    save_target(pair[0], tmp_path)
    edit_config(tmp_path, lambda c: c.update(hidden_act="gelu"))
    with pytest.raises(CheckpointError, match=f"{tmp_path / 'config.json'}: hidden_act 'gelu' is not supported"):
        load_target(tmp_path)


@pytest.mark.parametrize(
    "content, reason", [(b"", "header too small"), (b"\xff" * 70, "header too large")], ids=["empty", "garbage"]
)
def test_a_corrupt_safetensors_file_is_named(draft_folder, content, reason):
    (draft_folder / "model.safetensors").write_bytes(content)
    with pytest.raises(
        CheckpointError,
        match=re.escape(f"{draft_folder / 'model.safetensors'} is not a readable safetensors file ({reason})"),
    ):
        load_draft(draft_folder)


@pytest.mark.parametrize("index", ["{not json", "[1, 2]", '{"weight_map": {"norm.weight": 3}}'])
def test_an_index_that_is_no_json_object_is_named(draft_folder, index):
    (draft_folder / "model.safetensors.index.json").write_text(index)
    with pytest.raises(
        CheckpointError,
        match=re.escape(f"{draft_folder / 'model.safetensors.index.json'} is not a JSON object with a weight_map"),
    ):
        load_draft(draft_folder)


def test_a_file_given_as_a_folder_is_called_a_file(tmp_path):
    (tmp_path / "p.sh").write_text("echo hi\n")
    with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'p.sh'} is a file, not a folder")):
        load_draft(tmp_path / "p.sh")


def test_open_draft_ends_the_command_naming_the_folder_or_file(draft_folder, tmp_path):
    """What generate, evaluate and bench trained print for a --draft that is a file, or whose
    config.json is bad (drafts/folder.open_draft)."""
    from dflash_ref.drafts.folder import open_draft

    (tmp_path / "p.sh").write_text("echo hi\n")
    with pytest.raises(SystemExit, match=re.escape(f"--draft: {tmp_path / 'p.sh'} is a file, not a folder")):
        open_draft(tmp_path / "p.sh")
    edit_config(draft_folder, lambda c: c["dflash_config"].update(target_layer_ids=[1, 40]))
    with pytest.raises(SystemExit, match=re.escape(f"--draft: {draft_folder / 'config.json'}: target_layer_ids")):
        open_draft(draft_folder)
