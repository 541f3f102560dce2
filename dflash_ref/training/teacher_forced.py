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
    τ_tf    = 1 + mean_a L_a,    a_k = share of anchors with L_a ≥ k

It asks what a greedy decoding step asks, but at every position of a fixed response instead of only
where decoding's steps begin, so one target pass per response does it (no decoding loop), and it
can be split by c_a: where the target itself hesitates between tokens, a draft must match a near
tie. Its numbers are near decoding's, not equal: decoding never anchors inside an accepted run.
"""
from __future__ import annotations

import torch

from matplotlib.figure import Figure

from ..layer_sampling import extract_context_feature
from .recipe import output_logits, training_hidden

# edges of the target-confidence bins (c_a), the last one closed: [0, 0.3), …, [0.99, 1]
CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0)


def bin_label(b: dict) -> str:
    """"[low, high)" for a bin of `teacher_forced`'s by_confidence, "[low, high]" for the last one."""
    low, high = b["confidence"]
    return f"[{low}, {high}{']' if b['closed'] else ')'}"


def summary(leads: torch.Tensor, block_size: int) -> dict:
    """τ_tf and a_k from the leading-match counts L_a (m,)."""
    k = torch.arange(1, block_size)
    return {"anchors": len(leads), "tokens_per_step": 1 + leads.float().mean().item() if len(leads) else None,
            "acceptance_by_position": (leads[:, None] >= k).float().mean(0).tolist() if len(leads) else None}


@torch.no_grad()
def leading_matches(draft, target, token_ids: torch.Tensor, prompt_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence (1, T): L_a and c_a for every anchor a ≥ max(prompt_len, 1) with a whole block
    inside it; two empty tensors if there is none."""
    b = draft.block_size
    anchors = every_anchor(prompt_len, token_ids.shape[1], b)                   # (m,)
    if len(anchors) == 0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0)
    out = target(token_ids, output_hidden_states=True)
    probs = out.logits[0].float().softmax(-1)                                   # (T, V)
    greedy = probs.argmax(-1)                                                   # (T,) g_{p+1} at index p
    features = extract_context_feature(out.hidden_states, draft.target_layer_ids)   # (1, T, k·d)
    proposals = draft_proposals(draft, target, token_ids, features, anchors)    # (m, b − 1) d_k
    wanted = greedy[anchors[:, None] + torch.arange(b - 1)[None, :]]             # (m, b − 1) g_{a+k}
    return leading_count(proposals, wanted), probs.max(-1).values[anchors]      # L_a, c_a (m,) each


def every_anchor(prompt_len: int, seq_len: int, block_size: int) -> torch.Tensor:
    """Every anchor a ≥ max(prompt_len, 1) of a sequence of seq_len tokens whose whole block lies inside it
    (a + b − 1 ≤ T − 1), in order → (m,), empty if none."""
    first = max(prompt_len, 1)
    return torch.arange(first, max(first, seq_len - block_size + 1))


def leading_count(proposals: torch.Tensor, wanted: torch.Tensor) -> torch.Tensor:
    """L_a: the leading proposals (m, b − 1) equal to the tokens wanted there (m, b − 1) → (m,)."""
    return (proposals == wanted).long().cumprod(-1).sum(-1)


@torch.no_grad()
def draft_proposals(draft, target, token_ids: torch.Tensor, features: torch.Tensor,
                    anchors: torch.Tensor) -> torch.Tensor:
    """The draft's greedy proposals d_1 … d_{b−1} of the blocks anchored at `anchors` (m,) of one sequence
    (1, T) with its features (1, T, k·d), as decoding makes them: among the draft vocabulary if it has
    one, through the selector's greedy path for DFlash 2 → (m, b − 1)."""
    hidden, labels = training_hidden(draft, target, token_ids, features, anchors)   # (m, b − 1, d)
    logits, _ = output_logits(draft, target, hidden, labels)                    # (m, b − 1, V)
    vocab = getattr(draft, "draft_vocab", None)
    if vocab is not None:                 # proposals among the draft vocabulary only, as decoding makes them
        outside = torch.ones(logits.shape[-1], dtype=torch.bool)
        outside[vocab] = False
        logits = logits.masked_fill(outside, float("-inf"))
    selector = draft.candidate_selector
    return (logits.argmax(-1) if selector is None
            else selector.select(hidden, logits, token_ids[0, anchors], 0.0)[0])   # DFlash 2: the greedy path


def teacher_forced(draft, target, rows: list[dict], edges=CONFIDENCE_EDGES) -> dict:
    """τ_tf and a_k over all anchors of `rows` ({"ids", "prompt_len"}, as distill writes them), and
    the same per bin of the target's confidence c_a, with each bin's share of the anchors."""
    draft.eval()
    found = [leading_matches(draft, target, torch.tensor([r["ids"]]), r["prompt_len"]) for r in rows]
    leads = torch.cat([f[0] for f in found])
    confidence = torch.cat([f[1] for f in found])
    result = summary(leads, draft.block_size)
    result["by_confidence"] = []
    for low, high in zip(edges[:-1], edges[1:]):
        last = high == edges[-1]
        chosen = (confidence >= low) & ((confidence <= high) if last else (confidence < high))
        result["by_confidence"].append({"confidence": [low, high], "closed": last,
                                        "share": chosen.float().mean().item() if len(leads) else None,
                                        **summary(leads[chosen], draft.block_size)})
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
    ax.set_title(title or f"teacher-forced τ {result['tokens_per_step']:.3f} over {result['anchors']} anchors",
                 fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig

