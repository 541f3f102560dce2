"""On-policy error replay (training/replay.py): the visited anchors by hand, equal to greedy decoding's
own steps, and the batches it draws."""

from __future__ import annotations

import pytest
import torch
from conftest import make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.trace import StepLog
from dflash_ref.training.features import target_features
from dflash_ref.training.replay import replay_batch, sequence_errors, visited_errors

pytestmark = pytest.mark.usefixtures("one_thread_module")


def test_visited_errors_by_hand():
    # anchors 2 … 9; L = 1, 0, 2, 3, 0, 1, 0, 0. b = 4: visit 2 (L 1) → 4 (L 2) → 7 (L 1) → 9 (L 0) → 10, past
    leads = torch.tensor([1, 0, 2, 3, 0, 1, 0, 0])
    assert visited_errors(leads, 2, 4) == [2, 4, 7, 9]
    # b = 3: a block is whole at L = 2, so 4 is no error; the walk is the same
    assert visited_errors(leads, 2, 3) == [2, 7, 9]
    assert visited_errors(torch.tensor([3, 3, 3, 3, 3]), 0, 4) == []  # 0 → 4: every block accepted whole
    assert visited_errors(torch.zeros(0, dtype=torch.long), 5, 4) == []


@pytest.mark.parametrize("seed, version", [(0, 1), (1, 1), (3, 1), (1, 2), (3, 2)])
def test_the_errors_are_the_steps_greedy_decoding_rejects_a_proposal_in(seed, version):
    """On the target's own greedy response, the anchors `sequence_errors` finds are the starts of the
    whole-block decode steps of spec_generate (this draft, greedy) that accepted fewer than b − 1 proposals.
    A vocabulary of 4 makes the random draft right often enough for steps of every length."""
    overrides = (
        {"block_size": 4}
        if version == 1
        else {
            "block_size": 4,
            "version": 2,
            "conv_kernel_size": 2,
            "conv_group_size": 8,
            "selector_rank": 4,
            "selector_top_k": 2,
        }
    )
    target, draft = make_pair(seed, target_overrides={"vocab_size": 4}, draft_overrides=overrides)
    prompt = torch.tensor([[0, 1, 2, 1]])
    new = 40
    tokens = generate(target, prompt, new).output_ids  # (1, 4 + 40)
    steps = StepLog()
    out = spec_generate(draft, target, prompt, new, on_step=steps)
    assert torch.equal(out.output_ids, tokens)
    last = tokens.shape[1] - 4  # the last whole block's anchor
    decoded = [r.start for r in steps if len(r.block_ids) == 4 and r.start <= last and r.acceptance_length < 3]
    features = target_features(target, tokens, draft.target_layer_ids)
    found = sequence_errors(draft.eval(), target, tokens, features, prompt.shape[1])
    assert found == decoded
    lengths = {r.acceptance_length for r in steps}
    assert len(lengths) >= 2, lengths  # not a draft that is always rejected at once


def test_a_replay_batch_takes_the_errors_and_tops_them_up():
    data = [(3, torch.zeros(1, 30, dtype=torch.long)), (5, torch.zeros(1, 40, dtype=torch.long))]
    errors = {0: [4, 9, 12], 1: list(range(5, 37))}  # sequence 1 has more errors than anchors
    g = torch.Generator().manual_seed(0)
    picked = replay_batch(errors, data, batch=8, share=0.5, anchors=6, block_size=4, generator=g)
    assert len(picked) == 4
    for i, anchors in picked:
        assert len(anchors) == 6 and anchors.unique().numel() == 6 and torch.equal(anchors, anchors.sort().values)
        prompt_len, ids = data[i]
        assert anchors.min() >= prompt_len and anchors.max() <= ids.shape[1] - 4
        assert (
            set(anchors.tolist()) >= set(errors[i]) if len(errors[i]) <= 6 else set(anchors.tolist()) <= set(errors[i])
        )
    assert replay_batch({}, data, 8, 0.5, 6, 4, g) == []  # nothing found yet: the batch is the caller's
    before = g.get_state()
    replay_batch({}, data, 8, 0.5, 6, 4, g)
    assert torch.equal(g.get_state(), before)  # and draws nothing
