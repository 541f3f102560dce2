"""Context projection: C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)]), with hand-set weights."""

from __future__ import annotations

import pytest
import torch
from conftest import make_pair
from torch import nn

from dflash_ref.context import ContextHooks, project_context
from dflash_ref.hooks import hooks, name_hook_points
from dflash_ref.rmsnorm import RMSNorm


def hand_modules():
    # k = 2 target layers, d = 2: W_fc is (2, 4), no bias
    fc = nn.Linear(4, 2, bias=False)
    norm = RMSNorm(2, eps=1e-12)
    with torch.no_grad():
        fc.weight.copy_(torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, -1.0]]))
        norm.weight.copy_(torch.tensor([1.0, 2.0]))
    return fc, norm


# target_hidden rows (B = 1, L_c = 2), each concat[h^(l_1), h^(l_2)]:
#   [1, 2, 3, 4]: W_fc · x = [1 + 3, 2 − 4] = [4, −2]; mean(x²) = (16 + 4)/2 = 10
#                 → [4, −2]/√10 = [1.2649111, −0.6324555] → ⊙ [1, 2] = [1.2649111, −1.2649111]
#   [0, 0, 1, 1]: W_fc · x = [1, −1]; rms 1 → [1, −1] → ⊙ [1, 2] = [1, −2]
TARGET_HIDDEN = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 1.0, 1.0]]])
FC_OUT = torch.tensor([[[4.0, -2.0], [1.0, -1.0]]])
CONTEXT = torch.tensor([[[1.2649111, -1.2649111], [1.0, -2.0]]])


def test_projection_by_hand():
    fc, norm = hand_modules()
    context = project_context(TARGET_HIDDEN, fc, norm)
    assert context.shape == (1, 2, 2)
    torch.testing.assert_close(context, CONTEXT, rtol=0, atol=1e-6)


def test_hooks_see_fc_output_then_the_context():
    fc, norm = hand_modules()
    context_hooks = ContextHooks()
    name_hook_points(context_hooks, "ctx")
    seen = {}
    with hooks(context_hooks, lambda x, point: seen.__setitem__(point.name, x.clone())) as names:
        context = project_context(TARGET_HIDDEN, fc, norm, context_hooks)
    assert sorted(names) == ["ctx.hook_context", "ctx.hook_fc"]
    torch.testing.assert_close(seen["ctx.hook_fc"], FC_OUT, rtol=0, atol=1e-6)
    torch.testing.assert_close(seen["ctx.hook_context"], CONTEXT, rtol=0, atol=1e-6)
    assert torch.equal(seen["ctx.hook_context"], context)


def test_a_hook_can_replace_the_fc_output():
    # replacing W_fc·x by [3, 4] in both rows: RMSNorm → [0.8485281, 1.1313708] ⊙ [1, 2]
    fc, norm = hand_modules()
    context_hooks = ContextHooks()
    name_hook_points(context_hooks, "ctx")
    with hooks(
        context_hooks, lambda x, point: torch.tensor([3.0, 4.0]).expand_as(x), names=lambda n: n.endswith("hook_fc")
    ):
        context = project_context(TARGET_HIDDEN, fc, norm, context_hooks)
    torch.testing.assert_close(context, torch.tensor([0.8485281, 2.2627417]).expand(1, 2, 2), rtol=0, atol=1e-6)
    # and the hook is gone after the block
    torch.testing.assert_close(project_context(TARGET_HIDDEN, fc, norm, context_hooks), CONTEXT, rtol=0, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 2, 3), (1, 2, 8), (2, 4), (1, 1, 2, 4)])
def test_wrong_shape_is_refused_with_the_expected_shape(shape):
    fc, norm = hand_modules()
    with pytest.raises(
        ValueError,
        match=r"target_hidden must be \(batch, ctx_len, 4\) = \(B, L_c, "
        r"len\(target_layer_ids\) · hidden_size\), got " + str(tuple(shape)).replace("(", r"\(").replace(")", r"\)"),
    ):
        project_context(torch.zeros(shape), fc, norm)


def test_draft_model_uses_the_projection_once_for_all_layers():
    _, draft = make_pair(seed=1)
    target_hidden = torch.randn(1, 3, len(draft.target_layer_ids) * 32, generator=torch.Generator().manual_seed(0))
    seen = {}
    with hooks(
        draft, lambda x, point: seen.__setitem__(point.name, x.clone()), names=lambda n: n.startswith("draft.context.")
    ):
        draft(torch.arange(3 + 4)[None], noise_embedding=torch.randn(1, 4, 32), target_hidden=target_hidden)
    with torch.no_grad():
        expected = draft.hidden_norm(draft.fc(target_hidden))
    torch.testing.assert_close(seen["draft.context.hook_context"], expected)
    torch.testing.assert_close(seen["draft.context.hook_fc"], draft.fc(target_hidden).detach())
    assert draft.fc.bias is None and draft.fc.weight.shape == (32, 2 * 32)
