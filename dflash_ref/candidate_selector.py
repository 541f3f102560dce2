"""DFlash 2's candidate selector: the proposals as a path through the top-M candidates of every
block position, each step scored with the token chosen before it.

At proposal position t = 1..γ, from the draft's logits z_t (V,) and its final hidden h_t (d,):

    c_{t,1..M}  = the M tokens of largest z_t (M = `selector_top_k`), their logits the unary scores z_{t,m}
    score_{t,m} = z_{t,m} + ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,m})⟩       (rank r: E_pred, E_succ (V, r), P (r, d))
    x_t         = c_{t,m*}   m* = argmax_m score_{t,m} (greedy)   or   m* ~ q_t = softmax(score_t / T)

walked left to right from x_0 (the block's anchor token, already committed): the pair term lets each
proposal depend on the one chosen just before it, which the parallel draft alone cannot. When
sampling, q_t is a distribution over the M candidates only; acceptance.verify_rejection takes it
with the candidates (q is zero on every other token). M = 1 makes the path the argmax of z.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .hooks import HookPoint


class CandidateSelector(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, rank: int, top_k: int) -> None:
        super().__init__()
        self.top_k = top_k
        # plain (V, r) parameters, not nn.Embedding: released checkpoints store them without `.weight`
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))  # E_pred
        self.successor_codebook = nn.Parameter(torch.zeros(vocab_size, rank))  # E_succ
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)  # P
        self.hook_candidates = HookPoint()  # (B, γ, M) c_{t,m}, token ids
        self.hook_unary = HookPoint()  # (B, γ, M) z_{t,m}
        self.hook_pair = HookPoint()  # (B, γ, M) the pair term, with the predecessor actually chosen
        self.hook_path = HookPoint()  # (B, γ)    x_1..x_γ
        self.hook_q = HookPoint()  # (B, γ, M) q_t over the candidates (sampling only)

    def select(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float, sample=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """hidden (B, γ, d), logits (B, γ, V), anchor_ids (B,) → path (B, γ), candidates (B, γ, M),
        q (B, γ, M) or None (greedy). `sample(q)` draws one index per row of q (B, M) when T > 0."""
        # sorted=False: torch's own order of the top M, which the official code samples indices in
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)  # (B, γ, M) each
        candidates, unary = self.hook_candidates(candidates), self.hook_unary(unary)
        projected = self.hidden_projection(hidden)  # (B, γ, r)
        predecessor, path, pairs, q_rows = anchor_ids, [], [], []
        for t in range(hidden.shape[1]):
            pair = self.pair_term(predecessor, projected[:, t], candidates[:, t])  # (B, M)
            scores = unary[:, t] + pair
            if temperature > 0:
                q = torch.softmax(scores.float() / temperature, dim=-1)  # (B, M)
                index = sample(q)
                q_rows.append(q)
            else:
                index = scores.argmax(dim=-1)
            predecessor = candidates[:, t].gather(-1, index[:, None])[:, 0]  # the chosen candidate
            path.append(predecessor)
            pairs.append(pair)
        self.hook_pair(torch.stack(pairs, dim=1))
        path = self.hook_path(torch.stack(path, dim=1))  # (B, γ)
        return path, candidates, self.hook_q(torch.stack(q_rows, dim=1)) if q_rows else None

    def pair_term(self, predecessors: torch.Tensor, projected: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩: predecessors (…,), P h (…, r), candidates (…, M) → (…, M)."""
        query = F.embedding(predecessors, self.predecessor_codebook) * projected  # (…, r)
        return torch.einsum("...r,...kr->...k", query, F.embedding(candidates, self.successor_codebook))

    def teacher_forced(
        self, hidden: torch.Tensor, logits: torch.Tensor, previous: torch.Tensor, vocab: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position's scores at once, with given predecessors (training: the true previous tokens)
        instead of the walked path: hidden (…, d), logits (…, V) or over a vocabulary `vocab` (V',) of
        token ids, previous (…,) → candidates (…, M) as token ids, score_m = z_m + pair_m (…, M)."""
        unary, index = torch.topk(logits, self.top_k, dim=-1, sorted=False)  # (…, M) each
        candidates = index if vocab is None else vocab.to(index.device)[index]
        return candidates, unary + self.pair_term(previous, self.hidden_projection(hidden), candidates)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, rank={self.hidden_projection.out_features}"
