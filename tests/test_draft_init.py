"""A draft started from its target's layers: the copies, and draft layer 0 reading the context as the
copied target layer reads its input."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close, make_pair
from einops import rearrange

from dflash_ref.drafts.from_target import init_from_target
from dflash_ref.training.features import target_features

pytestmark = pytest.mark.usefixtures("one_thread_module")


def _pair():
    # target: 4 layers; draft: 2 layers fed by target layers 0 and 1, so layer 1's output is layer 2's input
    return make_pair(3, draft_overrides={"target_layer_ids": [0, 1]})


def test_the_last_layers_are_copied_and_the_context_starts_as_the_deepest_sampled_layer():
    target, draft = _pair()
    init_from_target(draft, target)
    for i, source in zip(range(2), target.model.layers[2:]):
        theirs = dict(source.named_parameters())
        for name, p in draft.layers[i].named_parameters():
            assert torch.equal(p, theirs[name]), name
    d = draft.config.hidden_size
    assert torch.equal(draft.fc.weight, torch.cat([torch.zeros(d, d), torch.eye(d)], dim=1))
    assert torch.equal(draft.norm.weight, target.model.norm.weight)


def test_draft_layer_0_keys_of_the_context_are_the_copied_layer_keys():
    """Context K of draft layer 0 = k_norm(k_proj(hidden_norm(fc(f)))); with fc = [0 | I] and
    hidden_norm = target layer 2's input norm this is target layer 2's K (before RoPE) exactly."""
    target, draft = _pair()
    init_from_target(draft, target)
    ids = torch.randint(0, 11, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states  # 5 × (1, 7, d)
        heads = lambda t: rearrange(t, "b l (h d) -> b h l d", d=8)  # noqa: E731
        layer = target.model.layers[2]
        theirs = layer.self_attn.k_norm(heads(layer.self_attn.k_proj(layer.input_layernorm(hidden[2]))))
        context = draft.hidden_norm(draft.fc(target_features(target, ids, draft.target_layer_ids)))
        attn = draft.layers[0].self_attn
        ours = attn.k_norm(heads(attn.k_proj(context)))  # (1, H_kv, 7, d_h)
    assert_close(ours, theirs)


def test_bad_layer_choices_are_named():
    target, draft = _pair()
    with pytest.raises(ValueError, match="has 2 layers"):
        init_from_target(draft, target, [1, 2, 3])
    with pytest.raises(ValueError, match="out of range"):
        init_from_target(draft, target, [3, 4])
    _, wide = make_pair(3, draft_overrides={"intermediate_size": 48})
    with pytest.raises(ValueError, match="the draft must have the target's shapes"):
        init_from_target(wide, target)
