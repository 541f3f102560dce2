"""Teacher-forced acceptance: a draft's proposals at every position of the target's own greedy
responses, checked against the target's greedy tokens, and binned by how sure the target itself is.

For a sequence x (prompt + the target's greedy response, fp32) and every anchor a in the response
whose whole block fits (a + b − 1 ≤ T − 1):

    g_{p+1} = argmax_v p(v | x_≤p)                the target's greedy token after position p
    c_a     = max_v p(v | x_≤a)                   the target's confidence in the token after the anchor
    d_k     = argmax_v q_k(v | C_<a, x_a)         the draft's proposal at block position k = 1 … b − 1:
                                                  the context features of positions < a, then the block
                                                  [x_a, mask, …] (training.training_hidden; over the
                                                  draft vocabulary, if the draft has one; DFlash 2: the
                                                  selector's greedy path from x_a)
    L_a     = max{ℓ ≤ b − 1 : d_k = g_{a+k} for every k ≤ ℓ}    the proposals greedy verification keeps
    τ + 1   = 1 + mean_a L_a                      teacher-forced tokens per step (τ = mean_a L_a accepted)
    a_k     = share of anchors with L_a ≥ k

It asks what a greedy decoding step asks, but at every position of a fixed response instead of only
where decoding's steps begin, so one target pass per response does it (no decoding loop), and it
can be split by c_a: where the target itself hesitates between tokens, a draft must match a near
tie. Its numbers are near decoding's, not equal: decoding never anchors inside an accepted run.

With `paths` = M (a DFlash 2 draft), what a verify of a tree would keep: the selector's M most probable paths
(best_paths) merged by their common prefixes, L_a the longest leading match of any of them,
and N_a the tree's nodes (distinct non-empty prefixes), so such a verify would take 1 + N_a tokens. A
measure only: decoding verifies one path.
"""

from __future__ import annotations

import torch
from matplotlib.figure import Figure

from ..dflash2 import selector_of
from ..layer_sampling import extract_context_feature
from .recipe import output_logits, training_hidden

# edges of the target-confidence bins (c_a), the last one closed: [0, 0.3), …, [0.99, 1]
CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


def bin_label(b: dict) -> str:
    """ "[low, high)" for a bin of `teacher_forced`'s by_confidence, "[low, high]" for the last one."""
    low, high = b["confidence"]
    return f"[{low}, {high}{']' if b['closed'] else ')'}"


def summary(leads: torch.Tensor, block_size: int) -> dict:
    """τ + 1 (teacher-forced) and a_k from the leading-match counts L_a (m,)."""
    k = torch.arange(1, block_size)
    return {
        "anchors": len(leads),
        "tokens_per_step": 1 + leads.float().mean().item() if len(leads) else None,
        "acceptance_by_position": (leads[:, None] >= k).float().mean(0).tolist() if len(leads) else None,
    }


@torch.no_grad()
def leading_matches(
    draft, target, token_ids: torch.Tensor, prompt_len: int, paths: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence (1, T): L_a, c_a and N_a (the proposals verified: b − 1, or a tree's nodes with `paths`)
    for every anchor a ≥ max(prompt_len, 1) with a whole block inside it; empty tensors if there is none."""
    b = draft.block_size
    anchors = every_anchor(prompt_len, token_ids.shape[1], b)  # (m,)
    if len(anchors) == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0, dtype=torch.long)
    out = target(token_ids, output_hidden_states=True)
    probs = out.logits[0].float().softmax(-1)  # (T, V)
    greedy = probs.argmax(-1)  # (T,) g_{p+1} at index p
    features = extract_context_feature(out.hidden_states, draft.target_layer_ids)  # (1, T, k·d)
    proposals = draft_proposals(draft, target, token_ids, features, anchors, paths)  # (m, b − 1) or (m, M, b − 1)
    wanted = greedy[anchors[:, None] + torch.arange(b - 1)[None, :]]  # (m, b − 1) g_{a+k}
    if paths is None:
        return leading_count(proposals, wanted), probs.max(-1).values[anchors], torch.full_like(anchors, b - 1)
    leads = leading_count(proposals, wanted[:, None]).max(-1).values  # the best of the M paths
    return leads, probs.max(-1).values[anchors], tree_nodes(proposals)


def tree_nodes(paths: torch.Tensor) -> torch.Tensor:
    """N_a: the distinct non-empty prefixes of each anchor's paths (m, M, γ) → (m,), the nodes of their tree."""
    return torch.tensor(
        [len({tuple(p[:t]) for p in rows for t in range(1, len(p) + 1)}) for rows in paths.tolist()], dtype=torch.long
    )


def every_anchor(prompt_len: int, seq_len: int, block_size: int) -> torch.Tensor:
    """Every anchor a ≥ max(prompt_len, 1) of a sequence of seq_len tokens whose whole block lies inside it
    (a + b − 1 ≤ T − 1), in order → (m,), empty if none."""
    first = max(prompt_len, 1)
    return torch.arange(first, max(first, seq_len - block_size + 1))


def leading_count(proposals: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """L_a: the leading proposals (m, b − 1) equal to the tokens wanted there (m, b − 1) → (m,)."""
    return (proposals == wanted).long().cumprod(-1).sum(-1)


@torch.no_grad()
def draft_proposals(
    draft, target, token_ids: torch.Tensor, features: torch.Tensor, anchors: torch.Tensor, paths: int | None = None
) -> torch.Tensor:
    """The draft's greedy proposals d_1 … d_{b−1} of the blocks anchored at `anchors` (m,) of one sequence
    (1, T) with its features (1, T, k·d), as decoding makes them: among the draft vocabulary if it has
    one, through the selector's greedy path for DFlash 2 → (m, b − 1); with `paths` = M the selector's M
    most probable paths instead → (m, M, b − 1)."""
    hidden, labels = training_hidden(draft, target, token_ids, features, anchors)  # (m, b − 1, d)
    logits, _ = output_logits(draft, target, hidden, labels)  # (m, b − 1, V)
    vocab = getattr(draft, "draft_vocab", None)
    if vocab is not None:  # proposals among the draft vocabulary only, as decoding makes them
        outside = torch.ones(logits.shape[-1], dtype=torch.bool)
        outside[vocab] = False
        logits = logits.masked_fill(outside, float("-inf"))
    if paths is not None:
        check_paths(draft, paths)
        return best_paths(selector_of(draft), hidden, logits, token_ids[0, anchors], paths)[0]  # (m, M, b − 1)
    return draft.choose_tokens(hidden, logits, token_ids[0, anchors], 0.0, 1.0, 0)[0]  # argmax, or DFlash 2's path


def best_paths(
    selector, hidden: torch.Tensor, logits: torch.Tensor, anchor_ids: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The `count` most probable paths through a DFlash 2 selector's candidates (a measure beside decoding,
    which walks one):

        log P(x_1..x_γ) = Σ_t log q_t(x_t | x_{t−1}),   q_t(· | x_{t−1}) = softmax_k score_{t,k}   (T = 1)

    found exactly by keeping, at every position and for every candidate c, the `count` best paths that end
    in c (q_t depends on the path only through x_{t−1}, so every best path's prefix is among them).
    hidden (B, γ, d), logits (B, γ, V), anchor_ids (B,) → paths (B, count, γ), log P (B, count), best
    first; count ≤ K^γ. count = 1 is the most probable path, which `select`'s greedy walk (the best next
    token at every step) need not be."""
    batch, gamma, k = hidden.shape[0], hidden.shape[1], selector.top_k
    if not 1 <= count <= k**gamma:
        raise ValueError(f"best_paths: count={count} must be 1 … K^γ = {k**gamma} (K={k}, γ={gamma})")
    unary, candidates = torch.topk(logits, k, dim=-1, sorted=False)  # (B, γ, K) each
    projected = selector.hidden_projection(hidden)  # (B, γ, r)
    first = torch.log_softmax(
        (unary[:, 0] + selector.pair_term(anchor_ids, projected[:, 0], candidates[:, 0])).float(), -1
    )
    # best[b, c, j]: log P of the j-th best path ending in candidate c; −inf where fewer than j + 1 exist
    best = torch.full((batch, k, count), float("-inf"), dtype=first.dtype, device=first.device)
    best[:, :, 0] = first  # (B, K) one path per c
    back = []  # per t ≥ 2: (B, K, count)
    for t in range(1, gamma):
        pair = selector.pair_term(
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


def check_paths(draft, paths: int) -> None:
    """A ValueError naming the problem unless the draft has a selector and 1 ≤ paths ≤ K^(b − 1)."""
    selector = selector_of(draft)
    if selector is None:
        raise ValueError(
            f"paths={paths!r}: a tree of the selector's paths needs a DFlash 2 draft; this one has no selector"
        )
    if not isinstance(paths, int) or not 1 <= paths <= selector.top_k ** (draft.block_size - 1):
        raise ValueError(
            f"paths={paths!r}: must be 1 … K^(b − 1) = {selector.top_k ** (draft.block_size - 1)} "
            f"(K = {selector.top_k}, b = {draft.block_size})"
        )


def teacher_forced(draft, target, rows: list[dict], edges=CONFIDENCE_EDGES, paths: int | None = None) -> dict:
    """τ + 1 (teacher-forced) and a_k over all anchors of `rows` ({"ids", "prompt_len"}, as distill writes
    them), and the same per bin of the target's confidence c_a, with each bin's share of the anchors; with
    `paths`, of a tree of the selector's best paths, and "paths" and "mean_nodes" (the mean N_a) say so."""
    draft.eval()
    if paths is not None:
        check_paths(draft, paths)  # before any target pass
    found = [leading_matches(draft, target, torch.tensor([r["ids"]]), r["prompt_len"], paths) for r in rows]
    leads = torch.cat([f[0] for f in found])
    confidence = torch.cat([f[1] for f in found])
    result = summary(leads, draft.block_size)
    if paths is not None:
        result |= {
            "paths": paths,
            "mean_nodes": torch.cat([f[2] for f in found]).float().mean().item() if len(leads) else None,
        }
    result["by_confidence"] = []
    for low, high in zip(edges[:-1], edges[1:]):
        last = high == edges[-1]
        chosen = (confidence >= low) & ((confidence <= high) if last else (confidence < high))
        result["by_confidence"].append(
            {
                "confidence": [low, high],
                "closed": last,
                "share": chosen.float().mean().item() if len(leads) else None,
                **summary(leads[chosen], draft.block_size),
            }
        )
    return result


def plot(result: dict, title: str = ""):
    """Per bin of the target's confidence c_a: the share of anchors (bars) and the draft's a_k
    (lines, k = 1 … b − 1), from `teacher_forced`'s result. Returns a matplotlib Figure."""
    bins = [b for b in result["by_confidence"] if b["anchors"]]
    labels = [bin_label(b) for b in bins]
    fig = Figure(figsize=(7.5, 3.6))
    ax = fig.subplots()
    x = range(len(bins))
    ax.bar(x, [b["share"] for b in bins], color="0.85", label="share of anchors")
    for k in range(len(bins[0]["acceptance_by_position"]) if bins else 0):
        ax.plot(x, [b["acceptance_by_position"][k] for b in bins], marker="o", label=f"a_{k + 1}")
    ax.set_xticks(list(x), labels)
    ax.set_ylim(0, 1)
    ax.set_xlabel("target's confidence c_a in the token after the anchor")
    ax.set_ylabel("fraction")
    ax.set_title(
        title or f"teacher-forced τ + 1 = {result['tokens_per_step']:.3f} over {result['anchors']} anchors", fontsize=9
    )
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig
