"""Acceptance: how many drafted tokens the target keeps, and the bonus token (seed: "Accept/Reject").

Notation: the block is [x_0, d_1, …, d_γ] (x_0 known, d_i drafted, γ = L_q − 1). One target pass
over the block gives, at each block position i = 0..γ, the target's distribution p_i of the *next*
token; the `posterior` is what the target would emit there.

Greedy (temperature 0), the seed's rule:

    posterior_i = argmax p_i
    acceptance_length τ = Σ_{i=1..γ} Π_{j≤i} 1[d_j = posterior_{j−1}]      (cumprod, then sum)
    bonus = posterior_τ   (the target's own token after the accepted run)

Temperature > 0, two verifiers, both lossless (every emitted token is distributed as the target's):

* "match" (the seed's loop): draft greedily, *sample* posterior_i ~ p_i at every position, then the
  same cumprod rule and bonus = posterior_τ. An accepted d_j equals a target sample, and the first
  mismatch emits that sample, so the output is exactly target sampling; acceptance is lower.
* "rejection" (standard speculative sampling, as `dflash` 0.1.0): draft d_i ~ q_i, accept d_i while
  u_i · q_i(d_i) < p_{i−1}(d_i) with u_i ~ U[0, 1); at the first rejection sample the bonus from
  norm(max(p − q, 0)); if all γ pass, sample the bonus from p_γ.

Random numbers are drawn in the same order as `dflash` 0.1.0 (draft sample, u, bonus), so with the
same seed both implementations give the same tokens.
"""

from __future__ import annotations

import math

import torch


def check_sampling(temperature: float, top_p: float = 1.0, top_k: int = 0) -> None:
    if not (temperature >= 0 and math.isfinite(temperature)):  # nan fails the first test, inf the second
        raise ValueError(f"temperature must be ≥ 0 and finite, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be an integer ≥ 0, got {top_k!r}")


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """softmax(logits / T) restricted to the top_k tokens and then to the top_p nucleus
    (renormalised), in float32. (…, V) → (…, V)."""
    if not temperature > 0:
        raise ValueError(f"sampling_probs needs temperature > 0, got {temperature} (use argmax for 0)")
    scores = logits.float() / temperature
    finite = torch.isfinite(scores.amax(dim=-1, keepdim=True))  # (…, 1)
    if not finite.all():
        # a row where T is so small that l / T overflows float32 (softmax would take inf − inf = nan):
        # softmax is shift-invariant, so (l − max l) / T, divided in float64 so that T itself does not
        # round to 0; as T → 0 this is argmax, ties shared. Every other row keeps l / T (the official rounding)
        shifted = (logits.double() - logits.double().amax(dim=-1, keepdim=True)) / temperature
        scores = torch.where(finite, scores, shifted.float())
    if 0 < top_k < scores.shape[-1]:
        top = torch.topk(scores, top_k, dim=-1)  # exactly k, ties included
        scores = torch.full_like(scores, float("-inf")).scatter(-1, top.indices, top.values)
    probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above
        sorted_probs = sorted_probs * (before < top_p)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def sample_probs(probs: torch.Tensor) -> torch.Tensor:
    """One draw per row: (…, V) → (…,)."""
    flat = probs.reshape(-1, probs.shape[-1])  # (N, V)
    return torch.multinomial(flat, 1).reshape(probs.shape[:-1])


def sample(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """argmax at temperature 0, else a draw from `sampling_probs`. (…, V) → (…,)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    return sample_probs(sampling_probs(logits, temperature, top_p, top_k))


def acceptance_length(draft_tokens: torch.Tensor, posterior: torch.Tensor) -> int:
    """τ = Σ_i Π_{j≤i} 1[d_j = posterior_{j−1}].  draft_tokens (1, γ), posterior (1, ≥ γ)."""
    matches = draft_tokens == posterior[:, : draft_tokens.shape[1]]  # (1, γ)
    return int(matches.int().cumprod(dim=1).sum(dim=1)[0])


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor):
    """→ (τ, bonus, posterior); target_logits (1, γ + 1, V)."""
    posterior = target_logits.argmax(dim=-1)  # (1, γ + 1)
    tau = acceptance_length(draft_tokens, posterior)
    return tau, posterior[0, tau], posterior


def verify_match(draft_tokens: torch.Tensor, target_probs: torch.Tensor):
    """Sample-and-match (the seed's loop) → (τ, bonus, posterior); target_probs (1, γ + 1, V)."""
    posterior = sample_probs(target_probs)  # (1, γ + 1)
    tau = acceptance_length(draft_tokens, posterior)
    return tau, posterior[0, tau], posterior


def verify_rejection(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    candidates: torch.Tensor | None = None,
):
    """Rejection sampling → (τ, bonus); draft_tokens (1, γ), target_probs (1, γ + 1, V),
    draft_probs (1, γ, V) (the q the draft tokens were drawn from), or with `candidates` (1, γ, M)
    (DFlash 2's selector) q over those M tokens only, (1, γ, M): q(v) = Σ_m q_m 1[c_m = v], zero on
    every other token, and the residual max(p − q, 0) subtracts q on the candidates' ids alone.

    Lossless with candidates too: the selector draws d_i ~ q_i given the path before it, so q_i is the
    draft's exact conditional distribution of d_i (zero outside the candidates), and accepting with
    probability min(1, p/q) then sampling norm(max(p − q, 0)) emits p's token, as for any q."""
    gamma = draft_tokens.shape[1]
    index = draft_tokens[..., None]  # (1, γ, 1)
    p = target_probs[:, :gamma].gather(-1, index)[..., 0]  # (1, γ) p_{i−1}(d_i)
    if candidates is None:
        q = draft_probs.gather(-1, index)[..., 0]  # (1, γ) q_i(d_i)
    else:
        q = (draft_probs * (candidates == index)).sum(-1)  # (1, γ) Σ_m q_m 1[c_m = d_i]
    accepted = torch.rand_like(q) * q < p  # u · q < p
    tau = int(accepted.int().cumprod(dim=1).sum(dim=1)[0])
    if tau == gamma:
        return tau, sample_probs(target_probs[:, -1])[0]
    if candidates is None:
        residual = (target_probs[0, tau] - draft_probs[0, tau]).clamp_min(0)  # (V,) max(p − q, 0)
    else:  # −q on the candidates' ids only
        residual = target_probs[0, tau].scatter_add(0, candidates[0, tau], -draft_probs[0, tau]).clamp_min(0)
    total = residual.sum()
    # p == q leaves no residual mass; then p itself is the right distribution
    residual = residual / total if total > 0 else target_probs[0, tau]
    return tau, sample_probs(residual[None])[0]


def verify_block(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float,
    top_p: float = 1.0,
    top_k: int = 0,
    verifier: str = "rejection",
    candidates: torch.Tensor | None = None,
):
    """The verifier a request asks for → (τ, bonus, posterior or None); draft_tokens (1, γ) as verified,
    target_logits (1, γ + 1, V), draft_probs (1, γ, V) with the rejection verifier when sampling
    ((1, γ, M) over `candidates` (1, γ, M) for a DFlash 2 draft)."""
    if temperature == 0:
        return verify_greedy(draft_tokens, target_logits)
    target_probs = sampling_probs(target_logits, temperature, top_p, top_k)  # (1, γ + 1, V)
    if verifier == "match":
        return verify_match(draft_tokens, target_probs)
    if draft_tokens.shape[1] == 0:  # nothing drafted (a block of 1): the bonus is a plain sample
        return 0, sample_probs(target_probs[:, -1])[0], None
    return (*verify_rejection(draft_tokens, target_probs, draft_probs, candidates), None)
