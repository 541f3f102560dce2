"""The recipe's departure for CPU budgets (training/recipe.py): the loss's softmax normaliser over a
sampled vocabulary instead of all V. The responses' tokens R are always in it; K others are drawn
uniformly every step, each counted (V − |R|)/K times:

    Z ≈ Σ_{v∈R} e^{z_v} + (V − |R|)/K · Σ_{v∈sample} e^{z_v}      (log-weight log((V − |R|)/K))
"""

from __future__ import annotations

import math

import torch


def training_vocabulary(token_lists, always=()) -> torch.Tensor:
    """The sorted distinct ids of the training responses (plus `always`, e.g. the stop tokens)."""
    ids = {int(t) for tokens in token_lists for t in tokens} | {int(t) for t in always}
    return torch.tensor(sorted(ids), dtype=torch.long)


def sampled_vocabulary(
    always: torch.Tensor, vocab_size: int, num_sampled: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`always` (R) + `num_sampled` distinct ids drawn uniformly from the rest, and each id's
    log-weight in the normaliser: 0 for R, log((V − |R|)/K) for a sampled id."""
    others = torch.ones(vocab_size, dtype=torch.bool)
    others[always] = False
    rest = others.nonzero()[:, 0]  # (V − |R|,)
    k = min(num_sampled, len(rest))
    sampled = rest[torch.randperm(len(rest), generator=generator)[:k]]
    log_weight = torch.cat([torch.zeros(len(always)), torch.full((k,), math.log(len(rest) / max(k, 1)))])
    return torch.cat([always, sampled]), log_weight


def with_log_weight(logits: torch.Tensor, vocab_log_weight: torch.Tensor | None) -> torch.Tensor:
    """The sampled normaliser's log-weights added to the logits (m, b − 1, V'), in fp32: under bf16
    autocast the logits are bf16, and log((V − |R|)/K) rounded to bf16 would bias Z."""
    if vocab_log_weight is None:
        return logits
    return logits.float() + vocab_log_weight.to(logits.device, torch.float32)


def positions_in(vocab: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Where each of `ids` (any shape) lies in `vocab` (V',), −1 for an id not in it."""
    size = int(torch.cat([vocab, ids.reshape(-1)]).max()) + 1
    position_in_vocab = torch.full((size,), -1, dtype=torch.long)
    position_in_vocab[vocab] = torch.arange(len(vocab))
    return position_in_vocab[ids]
