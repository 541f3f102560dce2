"""One answer to each of the notebooks' code exercises (exercises.py), shown only when a learner asks:
`show_answer(name)`. Plain torch, written as a learner would, not the library's own code (which the notebooks
show beside each stage): the exercise holds both to the same cases."""

from __future__ import annotations

import torch


def context_projection(target_hidden, fc_weight, norm_weight, eps):
    """C = RMSNorm(W_fc · concat[h^(l_1), …, h^(l_k)]): target_hidden (L_c, k·d) is already the concatenation."""
    projected = target_hidden @ fc_weight.T  # (L_c, d): W_fc has no bias
    return norm_weight * projected / torch.sqrt(projected.pow(2).mean(-1, keepdim=True) + eps)


def sliced_rope(q, k, cos, sin):
    """K rotated at every one of its L_k positions, Q at the last L_q only (the block's)."""

    def rotate_half(x):  # [a, b] → [−b, a]
        a, b = x.chunk(2, dim=-1)
        return torch.cat([-b, a], dim=-1)

    q_len = q.shape[-2]
    q_rot = q * cos[-q_len:] + rotate_half(q) * sin[-q_len:]
    k_rot = k * cos + rotate_half(k) * sin
    return q_rot, k_rot


def acceptance_length(draft_tokens, posterior):
    """τ: how many draft tokens, from the first, equal the target's token before them; the first miss ends it."""
    tau = 0
    for d, p in zip(draft_tokens, posterior):
        if d != p:
            break
        tau += 1
    return tau


def convolve(x, taps, base, group_size):
    """y_t = Σ_j (w_j + a_{t,j,g}) ⊙ x_{t−j}, with x before the block's start 0: x (L, d), taps (L, J, G),
    base (J, d) → (L, d)."""
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(base.shape[0]):
            if t - j >= 0:
                y[t] += (base[j] + taps[t, j].repeat_interleave(group_size)) * x[t - j]
    return y
