"""Confidence-gated verification: how many of the drafted tokens the target checks in a step.
An extension (neither the paper nor the official code has it; off unless asked for).

The draft always proposes a whole block in one pass; the target need not verify all of it. Where a
verify of a few tokens costs what one token costs (a GPU, or a CPU whose weights stream slowly: the
weights are read once either way), verifying everything is free. Where a verify of 3–4 tokens costs
clearly more than one of 2 (some CPUs: figures/bench/README.md, "The verify gate"), while the third
and fourth proposals of a small draft are rarely right, verify the whole block only when the draft
itself says its first two proposals are likely right:

    c_k = max_v q_k(v)               the draft's confidence at block position k: the largest
                                     probability of its distribution there (greedy, and the "match"
                                     verifier at any temperature: the softmax of its logits, so
                                     c_k = q_k(d_k) for the argmax d_k; the "rejection" verifier: of
                                     the distribution d_k is drawn from, temperature and top-p/top-k
                                     applied, so the same θ means a different cut there). A DFlash 2
                                     draft's q_k is its selector's, over the K candidates: softmax of
                                     the scores z + pair with the predecessor d_{k−1} (x_0 for k = 1),
                                     at T = 1 for greedy and "match", the sampled q_k for "rejection"
    L   = b     if c_1 · c_2 ≥ θ     the whole block [x_0, d_1, …, d_{b−1}]
          2     otherwise            [x_0, d_1]: the first proposal alone

Lossless for every θ: a shortened block is verified exactly as a block of that size would be, so
greedy output still equals the target's own, and sampling keeps the target's distribution. For
sampling this needs L to be independent of the drawn d_2 … d_γ (d_1 is verified either way): a
DFlash draft computes every q_k in one parallel pass, before any d_k is drawn, so a gate on the
distributions alone leaves each verified d_k distributed as q_k. (A DFlash 2 selector's q_2 depends on
the drawn d_1, which is verified either way, and on nothing drawn after it: given d_1, d_2 is still
distributed as q_2, so the same holds.) A gate on q_k(d_k) of the
*sampled* d_k would let only likely-looking d_2 through to verification, and rejection sampling,
which assumes d_2 ~ q_2, would then be biased (tests/test_lossless.py caught exactly this).
θ = 0 verifies every block whole (the official behaviour); θ > 1 never does. c_1 · c_2 ranks steps
by how likely both proposals are accepted, though it is no calibrated probability, and whether the
gate pays depends on the machine, so it is off by default.
"""

from __future__ import annotations

import dataclasses

import torch

from ..decoding import Block, DraftedProposal, Proposal, Proposer
from ..dflash2 import selector_of


class VerifyGate:
    """`spec_generate(..., extensions=[VerifyGate(θ)])`: after a draft pass, verify the whole block only
    when c_1 · c_2 ≥ θ, else [x_0, d_1] (`gate_block`); a block no draft pass made (a prompt lookup's)
    is verified whole."""

    def __init__(self, threshold: float) -> None:
        if threshold is None:
            raise ValueError("VerifyGate needs a number θ ≥ 0 (leave the extension out to verify every block whole)")
        check_gate(threshold)
        self.threshold = threshold

    def wrap(self, propose: Proposer) -> Proposer:
        def gated(block: Block) -> Proposal:
            proposal = propose(block)
            if not isinstance(proposal, DraftedProposal):  # no draft pass: nothing to gate on
                return proposal
            block_ids, draft_probs, candidates = gate_block(
                self.threshold,
                proposal.block_ids,
                proposal.logits,
                proposal.draft_probs,
                proposal.candidates,
                selector_of(proposal.draft),
                proposal.hidden,
            )
            return dataclasses.replace(proposal, block_ids=block_ids, draft_probs=draft_probs, candidates=candidates)

        return gated


def check_gate(threshold: float | None) -> None:
    """A gate must be None (off) or a real number θ ≥ 0."""
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(
            f"verify_gate must be None (verify every block whole) or a number θ ≥ 0 "
            f"(verify the whole block when c_1·c_2 ≥ θ), got {threshold!r}"
        )


def draft_confidence(draft_logits: torch.Tensor, draft_probs: torch.Tensor | None = None) -> torch.Tensor:
    """c_k at each block position: from draft_logits (1, γ, V) (softmax taken here) or, when the
    proposals are sampled, from draft_probs (1, γ, V), the distributions they are drawn from → (1, γ), fp32."""
    probs = draft_probs if draft_probs is not None else torch.softmax(draft_logits.float(), dim=-1)
    return probs.float().amax(dim=-1)  # (1, γ, V) → (1, γ)


def selector_confidence(
    selector,
    hidden: torch.Tensor,
    draft_logits: torch.Tensor,
    block_ids: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
) -> torch.Tensor:
    """c_k of a DFlash 2 draft (candidate_selector.py) at each proposal position: the largest probability
    of its selector's q_k over the K candidates. Sampled: draft_probs (1, γ, K) is q_k itself; greedy:
    softmax of the scores with the predecessors of the path, [x_0, d_1, …] = block_ids (1, γ + 1), as
    `select` scored them. hidden (1, γ, d), draft_logits (1, γ, V) → (1, γ), fp32."""
    if draft_probs is not None:
        return draft_probs.float().amax(dim=-1)  # (1, γ, K) → (1, γ)
    _, scores = selector.teacher_forced(hidden, draft_logits, block_ids[:, :-1])  # (1, γ, K)
    return torch.softmax(scores.float(), dim=-1).amax(dim=-1)


def gated_verify_size(confidence: torch.Tensor, draft_size: int, threshold: float | None) -> int:
    """L: `draft_size` (the whole drafted block) if the gate is off, the block has no second
    proposal, or c_1 · c_2 ≥ θ; else 2. confidence (1, ≥ 2) from `draft_confidence` or `selector_confidence`."""
    if threshold is None or draft_size <= 2:
        return draft_size
    return draft_size if float(confidence[0, 0] * confidence[0, 1]) >= threshold else 2


def gate_block(
    threshold: float | None,
    block_ids: torch.Tensor,
    draft_logits: torch.Tensor | None,
    draft_probs: torch.Tensor | None,
    candidates: torch.Tensor | None = None,
    selector=None,
    hidden: torch.Tensor | None = None,
):
    """The block the target verifies: block_ids (1, L_q) [x_0, d_1, …] cut to (1, L), and what the
    rejection verifier reads with it cut alike: draft_probs (1, L_q − 1, V or K) and a DFlash 2 draft's
    candidates (1, L_q − 1, K) → (block_ids, draft_probs, candidates); unchanged with the gate off
    (θ None) or fewer than two proposals. c_1, c_2 come from `selector_confidence` when `selector` (with
    the draft's final hidden states (1, L_q − 1, d)) is given, else from `draft_confidence`."""
    draft_size = block_ids.shape[1]
    if threshold is None or draft_size <= 2:
        return block_ids, draft_probs, candidates
    probs = draft_probs[:, :2] if draft_probs is not None else None
    confidence = (
        selector_confidence(selector, hidden[:, :2], draft_logits[:, :2], block_ids[:, :3], probs)
        if selector is not None
        else draft_confidence(draft_logits[:, :2], probs)
    )  # c_1, c_2: (1, 2)
    size = gated_verify_size(confidence, draft_size, threshold)

    def cut(t):
        return t[:, : size - 1] if t is not None else None  # (1, L_q − 1, …) → (1, L − 1, …)

    return block_ids[:, :size], cut(draft_probs), cut(candidates)
