"""Confidence-gated verification: how many of the drafted tokens the target checks in a step.
An extension (neither the paper nor the official code has it; off unless asked for).

The draft always proposes a whole block in one pass; the target need not verify all of it. Where a
verify of a few tokens costs what one token costs (a GPU, or a CPU whose weights stream slowly: the
weights are read once either way), verifying everything is free. On some CPUs it is not: on the
2-core machine of the earlier sessions a verify of 2 tokens cost one AR step, one of 4 tokens about
1.4 (README, "Benchmarks": `bench ceiling`) and one of 3 as much or more (`target/linear.py`'s
table), while the third and fourth proposals of a small draft are rarely right. There, verify the
whole block only when the draft itself says its first two proposals are likely right:

    c_k = max_v q_k(v)               the draft's confidence at block position k: the largest
                                     probability of its distribution there (greedy, and the "match"
                                     verifier at any temperature: the softmax of its logits, so
                                     c_k = q_k(d_k) for the argmax d_k; the "rejection" verifier: of
                                     the distribution d_k is drawn from, temperature and top-p/top-k
                                     applied, so the same θ means a different cut there)
    L   = b     if c_1 · c_2 ≥ θ     the whole block [x_0, d_1, …, d_{b−1}]
          2     otherwise            [x_0, d_1]: the first proposal alone

Lossless for every θ: a shortened block is verified exactly as a block of that size would be, so
greedy output still equals the target's own, and sampling keeps the target's distribution. For
sampling this needs L to be independent of the drawn d_2 … d_γ (d_1 is verified either way): a
DFlash draft computes every q_k in one parallel pass, before any d_k is drawn, so a gate on the
distributions alone leaves each verified d_k distributed as q_k. A gate on q_k(d_k) of the
*sampled* d_k would let only likely-looking d_2 through to verification, and rejection sampling,
which assumes d_2 ~ q_2, would then be biased (tests/test_lossless.py caught exactly this:
chi-square p = 4e-14).
θ = 0 verifies every block whole (the official behaviour); θ > 1 never does. The shipped SmolLM2
draft's c_1 · c_2 ranks steps well, though it is no calibrated probability (`bench trained`'s last
table: where it is ≥ 0.8 the target accepts both proposals in 93 % of the steps, 0.4–0.6 in 42 %,
below 0.2 in 6 %). Whether the gate pays depends on the machine (`bench trained`, θ = 0.5 against
b = 4 verified whole: 1.29× against 1.12× AR on the earlier machine, 1.35–1.39× against 1.43× on
that of 2026-11-30, where a verify of 4 tokens costs 1.04 AR steps), so it is off by default.
"""
from __future__ import annotations

import torch


def check_gate(threshold: float | None) -> None:
    """A gate must be None (off) or a real number θ ≥ 0."""
    if threshold is None:
        return
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
        raise ValueError(f"verify_gate must be None (verify every block whole) or a number θ ≥ 0 "
                         f"(verify the whole block when c_1·c_2 ≥ θ), got {threshold!r}")


def draft_confidence(draft_logits: torch.Tensor, draft_probs: torch.Tensor | None = None) -> torch.Tensor:
    """c_k at each block position: from draft_logits (1, γ, V) (softmax taken here) or, when the
    proposals are sampled, from draft_probs (1, γ, V), the distributions they are drawn from → (1, γ), fp32."""
    probs = draft_probs if draft_probs is not None else torch.softmax(draft_logits.float(), dim=-1)
    return probs.float().amax(dim=-1)                                        # (1, γ, V) → (1, γ)


def gated_verify_size(confidence: torch.Tensor, draft_size: int, threshold: float | None) -> int:
    """L: `draft_size` (the whole drafted block) if the gate is off, the block has no second
    proposal, or c_1 · c_2 ≥ θ; else 2. confidence (1, ≥ 2) from `draft_confidence`."""
    if threshold is None or draft_size <= 2:
        return draft_size
    return draft_size if float(confidence[0, 0] * confidence[0, 1]) >= threshold else 2
