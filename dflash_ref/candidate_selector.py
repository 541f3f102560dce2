"""DFlash 2's candidate selector: the proposals as a path through the top-K candidates of every
block position, each step scored with the token chosen before it.

At proposal position t = 1..γ, from the draft's logits z_t (V,) and its final hidden h_t (d,):

    c_{t,1..K}  = the K tokens of largest z_t, their logits the unary scores z_{t,k}
    score_{t,k} = z_{t,k} + ⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩       (rank r: E_pred, E_succ (V, r), P (r, d))
    x_t         = c_{t,k*}   k* = argmax_k score_{t,k} (greedy)   or   k* ~ q_t = softmax(score_t / T)

walked left to right from x_0 (the block's anchor token, already committed): the pair term lets each
proposal depend on the one chosen just before it, which the parallel draft alone cannot. When
sampling, q_t is a distribution over the K candidates only; acceptance.verify_rejection takes it
with the candidates (q is zero on every other token). K = 1 makes the path the argmax of z.
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
        self.hook_candidates = HookPoint()  # (B, γ, K) c_{t,k}, token ids
        self.hook_unary = HookPoint()  # (B, γ, K) z_{t,k}
        self.hook_pair = HookPoint()  # (B, γ, K) the pair term, with the predecessor actually chosen
        self.hook_path = HookPoint()  # (B, γ)    x_1..x_γ
        self.hook_q = HookPoint()  # (B, γ, K) q_t over the candidates (sampling only)

    def select(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, temperature: float, sample=None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """hidden (B, γ, d), logits (B, γ, V), anchor_ids (B,) → path (B, γ), candidates (B, γ, K),
        q (B, γ, K) or None (greedy). `sample(q)` draws one index per row of q (B, K) when T > 0."""
        # sorted=False: torch's own order of the top K, which the official code samples indices in
        unary, candidates = torch.topk(logits, self.top_k, dim=-1, sorted=False)  # (B, γ, K) each
        candidates, unary = self.hook_candidates(candidates), self.hook_unary(unary)
        projected = self.hidden_projection(hidden)  # (B, γ, r)
        predecessor, path, pairs, q_rows = anchor_ids, [], [], []
        for t in range(hidden.shape[1]):
            pair = self.pair_term(predecessor, projected[:, t], candidates[:, t])  # (B, K)
            scores = unary[:, t] + pair
            if temperature > 0:
                q = torch.softmax(scores.float() / temperature, dim=-1)  # (B, K)
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
        """⟨E_pred(x_{t−1}) ⊙ P h_t, E_succ(c_{t,k})⟩: predecessors (…,), P h (…, r), candidates (…, K) → (…, K)."""
        query = F.embedding(predecessors, self.predecessor_codebook) * projected  # (…, r)
        return torch.einsum("...r,...kr->...k", query, F.embedding(candidates, self.successor_codebook))

    def teacher_forced(
        self, hidden: torch.Tensor, logits: torch.Tensor, previous: torch.Tensor, vocab: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position's scores at once, with given predecessors (training: the true previous tokens)
        instead of the walked path: hidden (…, d), logits (…, V) or over a vocabulary `vocab` (V',) of
        token ids, previous (…,) → candidates (…, K) as token ids, score_k = z_k + pair_k (…, K)."""
        unary, index = torch.topk(logits, self.top_k, dim=-1, sorted=False)  # (…, K) each
        candidates = index if vocab is None else vocab.to(index.device)[index]
        return candidates, unary + self.pair_term(previous, self.hidden_projection(hidden), candidates)

    def best_paths(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, count: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The `count` most probable paths through the candidates (a measure beside decoding, which walks one):

            log P(x_1..x_γ) = Σ_t log q_t(x_t | x_{t−1}),   q_t(· | x_{t−1}) = softmax_k score_{t,k}   (T = 1)

        found exactly by keeping, at every position and for every candidate c, the `count` best paths that end
        in c (q_t depends on the path only through x_{t−1}, so every best path's prefix is among them).
        hidden (B, γ, d), logits (B, γ, V), anchor_ids (B,) → paths (B, count, γ), log P (B, count), best
        first; count ≤ K^γ. count = 1 is the most probable path, which `select`'s greedy walk (the best next
        token at every step) need not be."""
        batch, gamma, k = hidden.shape[0], hidden.shape[1], self.top_k
        if not 1 <= count <= k**gamma:
            raise ValueError(f"best_paths: count={count} must be 1 … K^γ = {k**gamma} (K={k}, γ={gamma})")
        unary, candidates = torch.topk(logits, k, dim=-1, sorted=False)  # (B, γ, K) each
        projected = self.hidden_projection(hidden)  # (B, γ, r)
        first = torch.log_softmax(
            (unary[:, 0] + self.pair_term(anchor_ids, projected[:, 0], candidates[:, 0])).float(), -1
        )
        # best[b, c, j]: log P of the j-th best path ending in candidate c; −inf where fewer than j + 1 exist
        best = torch.full((batch, k, count), float("-inf"), dtype=first.dtype, device=first.device)
        best[:, :, 0] = first  # (B, K) one path per c
        back = []  # per t ≥ 2: (B, K, count)
        for t in range(1, gamma):
            pair = self.pair_term(
                candidates[:, t - 1],
                projected[:, t, None].expand(batch, k, -1),
                candidates[:, t, None].expand(batch, k, k),
            )  # (B, K', K): x_{t−1} = c'
            step = torch.log_softmax((unary[:, t][:, None, :] + pair).float(), -1)  # (B, K', K) log q_t(c | c')
            extended = best[:, :, None, :] + step[..., None]  # (B, K', K, count)
            extended = extended.permute(0, 2, 1, 3).reshape(batch, k, k * count)  # (B, K, K'·count)
            best, index = extended.topk(count, dim=-1)  # (B, K, count) each
            back.append(index)  # c' · count + j
        scores, index = best.reshape(batch, k * count).topk(count, dim=-1)  # (B, count), c·count + j
        state, rank = index // count, index % count  # (B, count) each
        path = [candidates[:, gamma - 1].gather(-1, state)]
        for t in range(gamma - 1, 0, -1):  # follow the back pointers
            came = back[t - 1].reshape(batch, k * count).gather(-1, state * count + rank)  # (B, count)
            state, rank = came // count, came % count
            path.append(candidates[:, t - 1].gather(-1, state))
        return torch.stack(path[::-1], dim=-1), scores  # (B, count, γ), (B, count)

    def extra_repr(self) -> str:
        return f"top_k={self.top_k}, rank={self.hidden_projection.out_features}"
