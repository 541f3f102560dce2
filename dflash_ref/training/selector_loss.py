"""Training DFlash 2's candidate selector, teacher-forced: at every proposal position t of every block,
the selector's scores over its K candidates with the *true* previous token as the predecessor, and a
cross-entropy toward the true next token where it is among the candidates.

    c_{j,t}   = top-K of the draft logits z_{j,t}                        (as at inference)
    s_{j,t,k} = z_{j,t,k} + ⟨E_pred(x_{a_j+t−1}) ⊙ P h_{j,t}, E_succ(c_{j,t,k})⟩      x_{a_j} the anchor
    L_sel     = Σ_{j,t} w_t · 1[x_{a_j+t} ∈ c_{j,t}] · CE(s_{j,t}, index of x_{a_j+t})
                / Σ_{j,t} w_t · 1[x_{a_j+t} ∈ c_{j,t}]                 (0 where no label is a candidate)

Teacher forcing is where training departs from inference, whose predecessor is the candidate the
selector chose: at inference a proposal after a wrong one is rejected anyway (acceptance stops at the
first mismatch), so the predecessor that matters for τ is the true one. The unary term z keeps its
gradient: the selector's loss also shapes the draft's logits among its top K. No public recipe exists
(the DFlash 2 authors published none); this is the simplest loss that trains every selector weight.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F


def selector_loss(
    selector,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    previous: torch.Tensor,
    labels: torch.Tensor,
    weights: torch.Tensor,
    vocab: torch.Tensor | None = None,
) -> torch.Tensor:
    """hidden (m, γ, d), logits (m, γ, V) (or over `vocab` (V',), without the sampled normaliser's
    log-weights), previous and labels (m, γ) token ids, weights (γ,) → L_sel."""
    candidates, scores = selector.teacher_forced(hidden, logits, previous, vocab)  # (m, γ, K) each
    hit = candidates == labels[..., None]  # (m, γ, K)
    found = hit.any(-1)  # (m, γ)
    ce = F.cross_entropy(
        scores.float().reshape(-1, scores.shape[-1]), hit.int().argmax(-1).reshape(-1), reduction="none"
    ).reshape(found.shape)  # (m, γ)
    counted = weights.to(ce.device) * found
    return (ce * counted).sum() / counted.sum().clamp_min(torch.finfo(ce.dtype).tiny)
