"""transformers' Muse Glimmer assistant read as the DFlash 1 draft it is (muse_glimmer.py): its names and config
keys, its bidirectional windows (|q − k| ≤ W: DFlash's symmetric W + 1), folders written here and loaded by
transformers' own MuseGlimmerAssistantModel, and the same block hidden states out of both."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import draft_config, randomize_

from dflash_ref import load_draft
from dflash_ref.config import ConfigError
from dflash_ref.dflash2 import make_draft
from dflash_ref.drafts.checkpoint import save_muse_glimmer
from dflash_ref.muse_glimmer import DEFAULTS, FULL, SLIDING, muse_config
from dflash_ref.muse_glimmer import draft_config as muse_draft_config

pytestmark = pytest.mark.usefixtures("one_thread_module")


def muse_draft(windows: list[int | None], seed: int = 0):
    """A random DFlash 1 draft whose layers attend as Muse's: a bidirectional window W (a number) or all keys."""
    sizes = {w for w in windows if w is not None}
    config = draft_config(
        num_hidden_layers=len(windows),
        layer_types=[FULL if w is None else SLIDING for w in windows],
        sliding_window=sizes.pop() + 1 if sizes else None,
        is_causal=False,
    )
    draft = make_draft(config)
    randomize_(draft, seed)
    return draft.double().eval()


def test_a_folder_that_says_nothing_is_transformers_defaults():
    c = muse_draft_config({})
    assert c.num_hidden_layers == DEFAULTS["num_hidden_layers"] == 5
    assert c.layer_types == [SLIDING] * 5 and c.sliding_window == 2048 + 1 and c.is_causal is False
    assert (c.block_size, c.mask_token_id, c.target_layer_ids) == (16, 201818, [1, 13, 25, 37, 49])
    assert c.rope_theta == 500000.0 and c.hidden_size == 6656 and c.head_dim == 128
    assert c.vocab_size is None and c.num_target_layers is None  # both are the target's
    assert muse_draft_config({}, vocab_size=202048, num_target_layers=60).vocab_size == 202048


def test_muse_config_says_back_what_it_read():
    draft = muse_draft([2, None])
    said = muse_config(draft.config)
    assert said["sliding_window"] == 2 and said["layer_types"] == [SLIDING, FULL]
    back = muse_draft_config(said, draft.config.vocab_size, draft.config.num_target_layers)
    fields = ("layer_types", "sliding_window", "is_causal", "block_size", "mask_token_id", "target_layer_ids")
    assert all(getattr(back, f) == getattr(draft.config, f) for f in fields)
    assert back.rope_theta == draft.config.rope_theta and back.hidden_size == draft.config.hidden_size


@pytest.mark.parametrize(
    "change, cannot",
    [
        (dict(is_causal=True), "a causal sliding window"),
        (dict(sliding_window_kind="rotating"), "a rotating window"),
        (dict(output_multiplier=2.0), "output_multiplier 2.0"),
    ],
)
def test_what_muse_cannot_say_is_refused_by_name(change, cannot):
    config = dataclasses.replace(muse_draft([2, None]).config, **change)
    with pytest.raises(ConfigError, match=cannot):
        muse_config(config)


def test_a_dflash2_draft_is_not_a_muse_draft():
    config = draft_config(version=2, conv_kernel_size=3, conv_group_size=4, selector_rank=4, selector_top_k=2)
    with pytest.raises(ConfigError, match="a DFlash 2 draft"):
        muse_config(config)


@pytest.mark.parametrize("window", [-1, 2.5, True, "2"])
def test_a_window_that_is_no_whole_number_is_named(window):
    with pytest.raises(ConfigError, match="sliding_window must be a whole number"):
        muse_draft_config({"sliding_window": window})


def test_a_muse_folder_round_trips_through_the_reference(tmp_path):
    draft = muse_draft([2, None])
    save_muse_glimmer(draft, tmp_path / "muse", torch.float64)
    said = json.loads((tmp_path / "muse" / "config.json").read_text())
    assert said["model_type"] == "muse_glimmer_assistant" and said["architectures"] == ["MuseGlimmerAssistantModel"]
    back = load_draft(tmp_path / "muse", torch.float64)
    assert back.config.sliding_window == 3 and back.config.layer_types == draft.config.layer_types
    theirs = back.state_dict()
    assert all(torch.equal(v, theirs[k]) for k, v in draft.state_dict().items())


@pytest.mark.parametrize("windows", [[2, None], [None, None], [1, 1]])
def test_transformers_muse_model_computes_the_same_block(tmp_path, windows):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "MuseGlimmerAssistantModel"):
        pytest.skip("this transformers has no Muse Glimmer assistant (5.15 or newer has)")
    draft = muse_draft(windows)
    save_muse_glimmer(draft, tmp_path / "muse", torch.float64)
    theirs = transformers.MuseGlimmerAssistantModel.from_pretrained(tmp_path / "muse", dtype=torch.float64).eval()
    d, k = draft.config.hidden_size, len(draft.config.target_layer_ids)
    g = torch.Generator().manual_seed(1)
    context, block = torch.randn(1, 8, k * d, generator=g, dtype=torch.float64), 4
    noise = torch.randn(1, block, d, generator=g, dtype=torch.float64)
    positions = torch.arange(8 + block)[None]  # (1, L_c + L_q): the context's positions, then the block's
    cache = transformers.cache_utils.DFlashCache(config=theirs.config)  # as DFlashTokenCandidateGenerator calls it
    cache.set_previous_accepted_tokens(8)
    with torch.no_grad():
        ours = draft(positions, noise_embedding=noise, target_hidden=context)
        out = theirs(
            noise_embeds=noise, context_hidden_states=context, position_ids=positions,
            attention_mask=torch.ones(1, 8 + block, dtype=torch.long), past_key_values=cache,
        )  # fmt: skip
    torch.testing.assert_close(ours, out.last_hidden_state, rtol=0, atol=1e-12)
