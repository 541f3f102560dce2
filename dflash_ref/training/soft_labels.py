"""Soft labels (`train --soft-labels α`): the target's own next-token distribution as a second target
of the loss beside its greedy token (knowledge distillation, Hinton et al. 2015, as DistillSpec
applies it to drafts, arXiv 2310.08461). A departure from the paper's recipe, which trains on the
hard tokens alone; an option, measured in figures/training/levers.md.

    q_p        = softmax(z^target_p), the target's distribution of token p + 1 after x_0 … x_p, kept as
                 its top K (ids, probabilities) from the feature pass (features.py: the same fp32 forward)
    q̃_p        = q_p restricted to the training vocabulary R and renormalised (the draft proposes
                 among R only: extensions/draft_vocab.py; the loss's softmax holds R anyway)
    L_soft     = Σ_j Σ_{k=1}^{b−1} w_k · Σ_v q̃_{a_j+k−1}(v) · (−log p_{j,k}(v)) / (m · Σ_k w_k)
    L          = (1 − α) · L_hard + α · L_soft                      (L_hard: recipe.dflash_loss)

p_{j,k} is the draft's softmax at block j's position k, over the same (sampled) vocabulary as L_hard.
Block position k is labelled by the target at position a_j + k − 1, which saw the true tokens
x_{a_j+1} … x_{a_j+k−1} that the draft sees as masks: the same conditioning as the hard label, whose
token is (up to the distillation's bf16 rounding) the argmax of q. What the soft label adds is the
rest of q: how sure the target is, and its second choices, information a data-limited draft does not
get from one token per position.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.nn import functional as F

from .sampled_softmax import positions_in

TOP_K = 16  # the soft label's support: the target's 16 likeliest next tokens (the rest is left out)


class SoftTargets(NamedTuple):
    """The target's top-K next-token distribution at every position of one sequence."""

    ids: torch.Tensor  # (T, K) token ids, int64
    probs: torch.Tensor  # (T, K) fp32, renormalised over R (rows summing to 1, or to 0 where no id is in R)


def top_k_distribution(logits: torch.Tensor, k: int = TOP_K) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (…, V) → the top-k ids (…, k) and their probabilities under the full softmax (…, k), fp32."""
    probs, ids = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)  # (…, k) each
    return ids, probs


def restrict_to_vocab(ids: torch.Tensor, probs: torch.Tensor, vocab: torch.Tensor | None) -> SoftTargets:
    """q restricted to the ids in `vocab` (R; None: all V) and renormalised: q̃ (a row with none in R is 0)."""
    if vocab is not None:
        probs = probs * torch.isin(ids, vocab)
    return SoftTargets(ids, probs / probs.sum(-1, keepdim=True).clamp_min(torch.finfo(probs.dtype).tiny))


def soft_label_loss(
    logits: torch.Tensor,
    soft_ids: torch.Tensor,
    soft_probs: torch.Tensor,
    weights: torch.Tensor,
    vocab: torch.Tensor | None = None,
) -> torch.Tensor:
    """L_soft. logits (m, b − 1, V') over `vocab` (V',) (None: all V), the normaliser's log-weights added;
    soft_ids / soft_probs (m, b − 1, K): q̃ at each proposal position; weights (b − 1,)."""
    log_p = F.log_softmax(logits.float(), dim=-1)  # (m, b − 1, V')
    positions = soft_ids if vocab is None else positions_in(vocab, soft_ids)  # (m, b − 1, K), −1: not in it
    if ((positions < 0) & (soft_probs > 0)).any():
        raise ValueError(
            "a soft label with mass lies outside the loss's vocabulary; restrict it to the training "
            "vocabulary first (restrict_to_vocab)"
        )
    ce = -(soft_probs * log_p.gather(-1, positions.clamp_min(0))).sum(-1)  # (m, b − 1)
    return (ce * weights).sum() / (len(ce) * weights.sum())


def block_soft_targets(soft: SoftTargets, anchors: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The soft labels of every block's proposal positions: position k of block j (k = 1 … b − 1) takes
    q̃ at a_j + k − 1 → ids, probs (m, b − 1, K)."""
    at = anchors[:, None] + torch.arange(block_size - 1)[None]  # (m, b − 1)
    return soft.ids[at], soft.probs[at]
