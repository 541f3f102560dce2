"""Prompt lookup beside the draft (an extension, off by default; the official decoder has none): where
the last few committed tokens occurred before in the sequence, propose the tokens that followed them
there instead of drafting, and skip the draft's pass for that step.

At a step whose last committed token (the block's x_0) sits at position s, with t_p the token at
position p of prompt + output, for n = N_max down to N (`lookup` = N):

    J_n = { j : n − 1 ≤ j ≤ s − γ,  t_{j−n+1 … j} = t_{s−n+1 … s} }     earlier occurrences of the last n
                                                                         tokens with γ tokens after them
    d_k = t_{j* + k},  k = 1 … γ,   j* = max J_n  for the largest n with J_n ≠ ∅  (the latest, longest match)

and the draft proposes as usual when no n ≥ N matches. The target verifies either block the same way,
so the output stays the target's own: greedy, equal to AR's; sampled, the proposal is a deterministic
function of the committed prefix, a q that puts all its mass on d_k (one candidate of probability 1 for
the rejection verifier, acceptance.verify_rejection), so min(1, p/q) = p(d_k) and the residual is p
without d_k. What it is for: a small model's greedy answers repeat their own phrases and the prompt's,
which a draft trained on a few hundred thousand tokens predicts poorly (figures/training/levers.md,
"Prompt lookup beside the draft"). Where a lookup proposes, the step needs no draft pass; the context
features of its committed tokens wait for the next draft pass, which takes them all at once.
"""

from __future__ import annotations

import dataclasses

import torch

from ..decoding import Block, Proposal, Proposer

MAX_NGRAM = 3  # the longest suffix looked up: measured against 2 and 4 in figures/training/levers.md


class PromptLookup:
    """`spec_generate(..., extensions=[PromptLookup(N)])`: a step whose last N or more committed tokens
    occurred before proposes what followed them (`lookup_proposals`), with no draft pass; any other step
    drafts as usual. A step it answers has no draft pass, so it keeps that step's context features and
    hands them, in order, to the next step that drafts."""

    def __init__(self, n: int) -> None:
        if n is None:
            raise ValueError("PromptLookup needs N, 1 ≤ N ≤ 3 (leave the extension out to draft every step)")
        check_lookup(n)
        self.n = n

    def wrap(self, propose: Proposer) -> Proposer:
        waiting = []  # context features of the steps answered without a draft pass, (1, ·, k·d) each

        def propose_with_lookup(block: Block) -> Proposal:
            copied = lookup_proposals(block.output_ids, block.start, block.size - 1, self.n)  # (1, γ) or None
            if copied is None:
                if waiting:  # the draft takes every feature it has not seen, in order
                    context = torch.cat([*waiting, block.target_hidden], dim=1)  # (1, L_c, k·d)
                    block = dataclasses.replace(block, target_hidden=context)
                    waiting.clear()
                return propose(block)
            if block.target_hidden is not None:
                waiting.append(block.target_hidden)
            block_ids = block.ids()
            block_ids[:, 1:] = copied
            draft_probs, candidates = lookup_distribution(copied)
            return Proposal(block_ids, draft_probs, candidates)

        return propose_with_lookup


def check_lookup(lookup: int | None) -> None:
    """`lookup` N: None (off) or an integer 1 ≤ N ≤ MAX_NGRAM, the shortest suffix that may propose."""
    if lookup is None:
        return
    if isinstance(lookup, bool) or not isinstance(lookup, int) or not 1 <= lookup <= MAX_NGRAM:
        raise ValueError(
            f"lookup must be None (off) or an integer from 1 to {MAX_NGRAM} (the shortest "
            f"suffix of committed tokens that may propose), got {lookup!r}"
        )


def lookup_proposals(sequence: torch.Tensor, start: int, gamma: int, lookup: int | None) -> torch.Tensor | None:
    """d_1 … d_γ (1, γ) copied from the latest, longest earlier match of the tokens ending at `start`
    in `sequence` (1, ≥ start + 1), or None (no match of at least `lookup` tokens, lookup off, γ = 0)."""
    if lookup is None or gamma < 1:
        return None
    committed = sequence[0, : start + 1]  # (s + 1,) t_0 … t_s
    for n in range(min(MAX_NGRAM, start + 1 - gamma), lookup - 1, -1):  # n ≤ the s − γ + 1 tokens searched
        windows = committed[: start + 1 - gamma].unfold(0, n, 1)  # (s − γ − n + 2, n) ending at j ≤ s − γ
        hits = (windows == committed[start + 1 - n :]).all(dim=1).nonzero()  # (h, 1) window starts i, j = i + n − 1
        if len(hits):
            j = int(hits[-1, 0]) + n - 1
            return committed[j + 1 : j + 1 + gamma][None]  # (1, γ)
    return None


def lookup_distribution(proposals: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The q a lookup block was drawn from, in the candidate form the rejection verifier reads:
    candidates (1, γ, 1) the proposals themselves, q (1, γ, 1) all ones."""
    candidates = proposals[..., None]  # (1, γ, 1)
    return torch.ones(candidates.shape, dtype=torch.float32, device=proposals.device), candidates
