"""The loop's one seam (decoding.py): stage 2 is `propose(Block) → Proposal`, which each extension wraps,
in the order given; what an extension leaves alone is the plain loop, and the plain loop is stage 2's
`draft_block` alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_pair

from dflash_ref import generate, spec_generate
from dflash_ref.decoding import Block, Proposal
from dflash_ref.trace import StepLog


class Watching:
    """An extension that changes nothing: it counts its wraps and records what stage 2 was asked."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log, self.wraps = name, log, 0

    def wrap(self, propose):
        self.wraps += 1

        def watched(block: Block) -> Proposal:
            self.log.append((self.name, block.start, block.size))
            return propose(block)

        return watched


class TargetsOwn:
    """An extension that proposes the target's own greedy continuation without a draft pass."""

    def __init__(self, continuation: torch.Tensor) -> None:
        self.continuation = continuation

    def wrap(self, propose):
        def own(block: Block) -> Proposal:
            ids = block.ids()
            ids[:, 1:] = self.continuation[None, block.start + 1 : block.start + block.size]
            return Proposal(ids)

        return own


def test_an_extension_that_changes_nothing_leaves_the_plain_loop_and_wraps_in_order():
    target, draft = make_pair(4, draft_overrides={"block_size": 4})
    ids = torch.tensor([[3, 1, 4]])
    plain_records, records, log = StepLog(), StepLog(), []
    plain = spec_generate(draft, target, ids, 20, on_step=plain_records)
    inner, outer = Watching("inner", log), Watching("outer", log)
    out = spec_generate(draft, target, ids, 20, extensions=[inner, outer], on_step=records)
    assert torch.equal(out.output_ids, plain.output_ids) and records == plain_records
    assert inner.wraps == outer.wraps == 1  # once per call, not per step
    assert log[:2] == [("outer", 3, 4), ("inner", 3, 4)]  # the last extension is the outermost
    assert len(log) == 2 * len(records) and out.num_draft_passes == plain.num_draft_passes


def test_a_proposal_without_a_draft_pass_is_verified_as_any_other_and_runs_no_draft_pass():
    target, draft = make_pair(5, draft_overrides={"block_size": 4})
    ids = torch.tensor([[2, 7, 1]])
    ar = generate(target, ids, 18).output_ids
    records = StepLog()
    out = spec_generate(draft, target, ids, 18, extensions=[TargetsOwn(ar[0])], on_step=records)
    assert torch.equal(out.output_ids, ar)
    assert out.num_draft_passes == 0 and all(r.acceptance_length == len(r.block_ids) - 1 for r in records)
    assert all(r.draft_cache_after == r.draft_cache_before == 0 for r in records)  # no draft pass: no K/V


class SkipsOnce:
    """An extension that answers the step at `position` with the target's own continuation, and drafts at
    every other; `carry`: it hands that step's context features on to the next draft pass, as it must."""

    def __init__(self, continuation: torch.Tensor, position: int, carry: bool) -> None:
        self.continuation, self.position, self.carry = continuation, position, carry

    def wrap(self, propose):
        kept = []

        def skipping(block: Block) -> Proposal:
            if block.start == self.position:
                kept.append(block.target_hidden)
                ids = block.ids()
                ids[:, 1:] = self.continuation[None, block.start + 1 : block.start + block.size]
                return Proposal(ids)
            if kept and self.carry:
                block = dataclasses.replace(block, target_hidden=torch.cat([kept.pop(), block.target_hidden], dim=1))
            return propose(block)

        return skipping


def test_an_extension_that_skips_the_draft_must_hand_on_the_steps_features_or_is_refused():
    target, draft = make_pair(6, draft_overrides={"block_size": 4})
    ids = torch.tensor([[2, 7, 1]])
    ar = generate(target, ids, 18).output_ids
    plain = StepLog()
    spec_generate(draft, target, ids, 18, on_step=plain)
    skipped = plain[1].start  # a step after a draft pass, with one after it
    records = StepLog()
    out = spec_generate(draft, target, ids, 18, extensions=[SkipsOnce(ar[0], skipped, True)], on_step=records)
    assert torch.equal(out.output_ids, ar)
    after = next(r for r in records if r.start > skipped)
    # the pass after the skipped step takes the context from before it on: no gap in the draft's context
    assert after.draft_cache_before < skipped and after.draft_cache_before + after.ctx_len == after.start
    with pytest.raises(ValueError, match="must hand that step's features"):
        spec_generate(draft, target, ids, 18, extensions=[SkipsOnce(ar[0], skipped, False)])


def test_a_draft_without_a_proposal_rule_is_refused_before_any_work():
    target, draft = make_pair(0)

    class NoRule(torch.nn.Module):  # a wrapper that forgot to pass the draft's propose on
        def __init__(self) -> None:
            super().__init__()
            self.draft, self.config = draft, draft.config

        block_size = property(lambda self: self.draft.block_size)
        mask_token_id = property(lambda self: self.draft.mask_token_id)
        target_layer_ids = property(lambda self: self.draft.target_layer_ids)

    with pytest.raises(TypeError, match="has no choose_tokens"):
        spec_generate(NoRule(), target, torch.tensor([[1, 2]]), 4)
