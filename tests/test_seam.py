"""The loop's one seam (decoding.py): stage 2 is `propose(Block) → Proposal`, which each extension wraps,
in the order given; what an extension leaves alone is the plain loop, and the plain loop is stage 2's
`draft_block` alone."""

from __future__ import annotations

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


def test_a_proposal_without_a_draft_pass_is_verified_as_any_other_and_the_context_waits():
    target, draft = make_pair(5, draft_overrides={"block_size": 4})
    ids = torch.tensor([[2, 7, 1]])
    ar = generate(target, ids, 18).output_ids
    records = StepLog()
    out = spec_generate(draft, target, ids, 18, extensions=[TargetsOwn(ar[0])], on_step=records)
    assert torch.equal(out.output_ids, ar)
    assert out.num_draft_passes == 0 and all(r.acceptance_length == len(r.block_ids) - 1 for r in records)
    assert all(r.draft_cache_after == r.draft_cache_before == 0 for r in records)  # no draft pass: no K/V
